"""The exception hierarchy: everything effectful-durable raises is a DurableError."""

from __future__ import annotations

import errno as _errno
import os
from typing import Any, Literal


class DurableError(Exception):
    """Base class for every error raised by effectful-durable."""


class NotOurDatabaseError(DurableError):
    """The file exists but is not an effectful-durable database; it was left untouched."""

    def __init__(self, path: str, reason: str = "") -> None:
        self.path = path
        detail = f" ({reason})" if reason else ""
        msg = (
            f"{path} is not an effectful-durable database{detail}. "
            "Nothing was written to it. Pass the path of a new file, "
            "or of a database this library created (if it was one, put back a copy "
            "made with Store.backup, or pass on_unreadable='quarantine' to move it "
            "aside and start a new database)."
        )
        super().__init__(msg)


class DatabaseCorruptError(DurableError):
    """SQLite found the database file damaged; what was asked of it was not done.

    Raised when the file is opened (``during`` is None), or when damage is found
    later, while reading or during a turn (``during`` names what was being done).
    Nothing was written to the file by the refusal, and the Store that found the
    damage writes nothing more to it (later writes raise this at once) nor
    checkpoints its WAL into it, so the file stays as it was for a restore.

    .. versionadded:: 0.2.0
    """

    def __init__(self, path: str, detail: str, during: str | None = None) -> None:
        self.path = path
        self.detail = detail
        self.during = during
        if during is None:
            msg = (
                f"{path} is damaged ({detail}). Nothing was written to it. Put back a "
                "copy made with Store.backup, or pass on_unreadable='quarantine' to "
                "move it aside and start a new database."
            )
        else:
            msg = (
                f"{path} is damaged ({detail}), found during {during}; that was not "
                "done and nothing was written. Stop the programs that use the file and "
                "put back a copy made with Store.backup (`effectful-durable check` "
                "shows the damage)."
            )
        super().__init__(msg)


class DamagedRowError(DatabaseCorruptError):
    """One stored row fails its checksum: it was damaged, or changed by another program.

    Every row effectful-durable writes carries a CRC-32 of its values (the agent,
    conversation and versions it belongs to included); a row whose values no
    longer match it is refused when it is read, never returned. Only what needs
    that row is refused: other agents, and the agent's other versions, read and
    write as before. ``table``, ``agent_id``, ``conversation`` and ``version``
    say where the row claims to belong (``None`` where its table has no such
    column).

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        path: str,
        table: str,
        agent_id: str | None,
        conversation: str | None,
        version: int | None,
        *,
        reason: str = "fails its checksum",
    ) -> None:
        self.table = table
        self.agent_id = agent_id
        self.conversation = conversation
        self.version = version
        where = ", ".join(
            f"{name} {value!r}"
            for name, value in (
                ("agent", agent_id),
                ("conversation", conversation),
                ("version", version),
            )
            if value is not None
        )
        super().__init__(path, f"a row of {table} ({where}) {reason}")
        back = (
            f"Roll agent {agent_id!r} back to a version before {version} "
            "(Store.rollback, or `effectful-durable rollback`), or put back a copy made "
            "with Store.backup"
            if agent_id is not None and version is not None
            else "Put back a copy made with Store.backup"
        )
        self.args = (
            f"{path}: a row of {table} ({where}) {reason}: the file was damaged "
            "there, or a program other than effectful-durable changed that row, and what "
            f"needed it was not done. Other agents are not affected. {back}; "
            "`effectful-durable check` lists every such row.",
        )


class KeyUnavailableError(DurableError):
    """Encryption at rest has no key for what was asked: missing, wrong, or erased.

    Raised as a database opens (a database that is encrypted, opened without
    ``keys=``; keys that are not the ones that sealed it), and nothing is
    written; or as a row is read whose data key is not in the key store.
    ``erased`` is True when the key was destroyed by an erasure
    (:class:`ContentErasedError` is raised for such a row).

    .. versionadded:: 0.2.0
    """

    def __init__(self, message: str, *, erased: bool = False) -> None:
        super().__init__(message)
        self.erased = erased


class ContentErasedError(KeyUnavailableError, LookupError):
    """A row's content was erased: its data key was destroyed (:meth:`Store.erase`).

    What a copy made before the erasure (a backup, a file copy, ``pg_dump``) says
    for the erased subject's rows; every other row of the copy reads as before.

    .. versionadded:: 0.2.0
    """

    def __init__(self, location: str, table: str, agent_id: str, conversation: str | None) -> None:
        self.location = location
        self.table = table
        self.agent_id = agent_id
        self.conversation = conversation
        where = f"agent {agent_id!r}" + (
            f", conversation {conversation!r}" if conversation else ""
        )
        msg = (
            f"{location}: a row of {table} ({where}) was erased: its key was destroyed, "
            "so no copy of the database can reveal it."
        )
        super().__init__(msg, erased=True)


class SchemaTooNewError(DurableError):
    """The database was written by a newer effectful-durable than this one."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        msg = (
            f"{path} was written by a newer effectful-durable (schema {found}; "
            f"this version reads <= {supported}). "
            "Upgrade the package, or open a copy with the version that wrote it "
            "(if none did, its header is damaged: put back a copy made with Store.backup)."
        )
        super().__init__(msg)


class DatabaseBusyError(DurableError):
    """The database stayed locked by another writer for longer than busy_timeout.

    ``.waited_for`` names the lock when it was none of this database's writers'
    (on PostgreSQL, a lock a commit takes that is shared with the whole server).
    """

    def __init__(self, path: str, busy_timeout: float, *, waited_for: str | None = None) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.waited_for = waited_for
        if waited_for is None:
            msg = (
                f"{path} stayed locked by another writer for {busy_timeout:g} s. "
                "Retry, or raise busy_timeout if writers hold it this long on purpose."
            )
        else:
            msg = (
                f"A commit to {path} waited {busy_timeout:g} s for {waited_for}, and "
                "gave up: nothing of it was written. Retry once that is released."
            )
        super().__init__(msg)


class AgentInUseError(DurableError):
    """Another thread or process is running a turn of the same agent."""

    def __init__(self, agent_id: str, holder: str) -> None:
        self.agent_id = agent_id
        self.holder = holder
        msg = (
            f"agent {agent_id!r} is in use by {holder}. "
            "One agent runs one turn at a time; wait for that turn to finish, "
            "pass wait=<seconds> to PersistenceHandler to wait for it, "
            "or fork the agent to run a copy."
        )
        super().__init__(msg)


class HoldLapsedError(AgentInUseError):
    """This process's hold on an agent lapsed before its write: nothing of it was written.

    On PostgreSQL a process holds an agent by renewing a lease row in the
    server's clock; one that cannot renew it in time (its host cut from the
    database, the process stalled) loses the agent, and another process may take
    it. What the process then tries to commit under that hold is refused, whether
    or not another process took the agent meanwhile.

    .. versionadded:: 0.2.0
    """

    def __init__(self, agent_id: str, reason: str) -> None:
        self.agent_id = agent_id
        self.holder = "another process, or nobody"
        self.reason = reason
        msg = (
            f"this process's hold on agent {agent_id!r} lapsed before its write committed: "
            f"{reason}. Nothing of that write (a turn's commit, the record of its "
            "failure, or a change such as a rollback) was written, and another process "
            "may be running the agent now. A "
            "hold lapses when its process cannot renew it in time (cut off from the "
            "database, or stalled); run the turn again once the database answers."
        )
        DurableError.__init__(self, msg)


class InvalidAgentIdError(DurableError, ValueError):
    """An agent id is empty, too long, or holds non-printable characters."""

    def __init__(self, agent_id: object, reason: str) -> None:
        self.agent_id = agent_id
        msg = (
            f"invalid agent_id {agent_id!r}: {reason}. An agent id is a non-empty "
            "string of at most 200 printable characters, such as 'support-bot-42'."
        )
        super().__init__(msg)


class InvalidConversationIdError(DurableError, ValueError):
    """A conversation id is empty, too long, or holds non-printable characters.

    .. versionadded:: 0.2.0
    """

    def __init__(self, conversation: object, reason: str) -> None:
        self.conversation = conversation
        msg = (
            f"invalid conversation id {conversation!r}: {reason}. A conversation id is a "
            "non-empty string of at most 200 printable characters, such as 'c-42'."
        )
        super().__init__(msg)


class InvalidSubjectError(DurableError, ValueError):
    """A subject (who an agent's content is about) is empty, too long, or holds
    non-printable characters.

    .. versionadded:: 0.2.0
    """

    def __init__(self, subject: object, reason: str) -> None:
        self.subject = subject
        msg = (
            f"invalid subject {subject!r}: {reason}. A subject names the person or tenant "
            "an agent's content is about: a non-empty string of at most 200 printable "
            "characters, such as 'user:42'."
        )
        super().__init__(msg)


class StateSerializationError(DurableError, TypeError):
    """A value to persist cannot be stored as JSON; nothing was written."""

    def __init__(
        self, owner: str, field: str, value_type: str, reason: str, advice: str = ""
    ) -> None:
        self.owner = owner
        self.field = field
        self.value_type = value_type
        advice = advice or (
            "Annotate the field with a type pydantic can serialise, or mark it "
            "ephemeral() to keep it out of the database."
        )
        msg = (
            f"cannot persist {owner}.{field}: a value of type {value_type} "
            f"cannot be stored as JSON ({reason}). Nothing was written. {advice}"
        )
        super().__init__(msg)


class StateMigrationError(DurableError):
    """An agent's stored fields cannot be brought up to its class's state version.

    ``.agent_class`` names the class, ``.found`` the version the stored fields
    were written at, ``.expected`` the class's ``__state_version__``. Nothing
    was written.
    """

    def __init__(self, agent_class: str, found: int, expected: int, reason: str) -> None:
        self.agent_class = agent_class
        self.found = found
        self.expected = expected
        msg = (
            f"cannot load the stored fields of a {agent_class} (state version {found}) "
            f"as state version {expected}: {reason}. Nothing was written."
        )
        super().__init__(msg)


class NotFoundError(DurableError, LookupError):
    """The database holds no such agent, or no such version of it."""


class WorkflowDivergedError(DurableError):
    """A resumed workflow asked for a different step than its journal recorded."""

    def __init__(self, workflow: str, step: str, expected: str, got: str) -> None:
        self.workflow = workflow
        self.step = step
        self.expected = expected
        self.got = got
        msg = (
            f"workflow {workflow!r} diverged at step {step}: the journal recorded "
            f"{expected}, but the program asked for {got}. Nothing was written. "
            "Run the program that started the workflow, or reset the workflow "
            "from this step."
        )
        super().__init__(msg)


class MemoryWriteError(DurableError, ValueError):
    """A write to an agent's memory was refused (bad key or value, or a limit); nothing written."""

    def __init__(self, agent_id: str, reason: str) -> None:
        self.agent_id = agent_id
        self.reason = reason
        msg = f"cannot write the memory of agent {agent_id!r}: {reason}. Nothing was written."
        super().__init__(msg)


class SQLWorkspaceError(DurableError):
    """An agent's SQL workspace was declared wrongly, or a query on it was refused.

    .. versionadded:: 0.2.0
    """


class InvalidAlarmError(DurableError, ValueError):
    """An alarm was asked for with a bad delay, time, interval, cron string or action.

    Nothing was scheduled. ``reason`` says what to change.

    .. versionadded:: 0.2.0
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"cannot schedule the alarm: {reason}. Nothing was scheduled.")


class TurnSuspended(DurableError):
    """A turn, or a workflow step, waits for people or events; nothing of it is lost.

    Raised by a template call whose turn suspended: the model called a tool that
    needs approval (``approvals`` lists the calls waiting, their ids to decide on),
    or a workflow step waits for an event (``events`` names them). What the turn
    did so far is committed; no process needs to stay alive while it waits.
    Calling the agent again before every decision is made raises this again, with
    no model call and nothing written. See :doc:`/approvals`.

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        agent_id: str | None,
        approvals: list[Any],
        events: list[tuple[str, str, float]] | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.approvals = list(approvals)
        self.events = list(events or [])
        waits = [
            f"approval {a.approval_id} of {a.tool}({_brief(a.arguments)}) by agent {a.agent_id!r}"
            for a in self.approvals
            if a.status == "pending"
        ]
        waits += [f"event {name!r} for agent {agent!r}" for agent, name, _ in self.events]
        msg = (
            f"waiting for {'; '.join(waits) or 'a decision'}. What the turn did so far is "
            "committed. Decide with `effectful-durable approve|deny ID` (or "
            "Store.approve/deny), send events with `effectful-durable send-event`, then "
            "call the agent again, run the workflow again, or let an AgentRunner resume it."
        )
        super().__init__(msg)


def _brief(arguments: Any) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in dict(arguments).items())
    return text if len(text) <= 120 else text[:117] + "..."


class InvalidDecisionError(DurableError, ValueError):
    """A decision on an approval was refused; nothing was changed.

    The approval was decided already (or cancelled by a rollback), or the edited
    arguments do not fit the tool's parameters, or the reason is not text.

    .. versionadded:: 0.2.0
    """


class InvalidEventError(DurableError, ValueError):
    """An event was refused (its agent, name, payload or key); nothing was sent.

    .. versionadded:: 0.2.0
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        # A reason may be a sentence of its own (an invalid agent id's): one full stop.
        super().__init__(f"cannot send the event: {reason.rstrip('.')}. Nothing was sent.")


class AlarmLeaseLostError(DurableError):
    """A runner's lease on an alarm ended before the turn delivering it could commit.

    Another runner claimed the alarm (or it was cancelled) meanwhile, so the
    turn committed nothing; the alarm is delivered by whoever holds it now.

    .. versionadded:: 0.2.0
    """

    def __init__(self, alarm_id: str, agent_id: str) -> None:
        self.alarm_id = alarm_id
        self.agent_id = agent_id
        msg = (
            f"the lease on alarm {alarm_id!r} of agent {agent_id!r} was lost before its "
            "turn committed (another runner claimed it, or it was cancelled); the turn "
            "committed nothing. Give turns more time with a longer lease."
        )
        super().__init__(msg)


class StorageError(DurableError):
    """The operating system failed a read, write or sync of a database file (an I/O error).

    The operation that met it did not commit, and every earlier commit is
    intact: SQLite rolls back what it had begun. ``path`` is the database file
    (its ``-wal`` file is part of it), ``operation`` what failed (``"write"``,
    ``"sync"``, ``"read"``, ...), ``errno`` the operating system's error number
    when SQLite reported one, and ``code`` SQLite's extended result code.

    A commit whose sync failed is gone for this process, and its next commit
    overwrites it; but the disk may have kept it, so after a crash it may show
    as committed (whole) when the database is reopened.

    .. versionadded:: 0.2.0
    """

    def __init__(self, path: str, *, operation: str, errno: int | None, code: str) -> None:
        self.path = path
        self.operation = operation
        self.errno = errno
        self.code = code
        msg = f"cannot {operation} {path}: {self._problem()}. {self._outcome()} {self._advice()}."
        super().__init__(msg)

    def _problem(self) -> str:
        if self.errno:
            name = _errno.errorcode.get(self.errno, str(self.errno))
            return f"{os.strerror(self.errno)} ({name}; SQLite {self.code})"
        return f"an I/O error (SQLite {self.code})"

    def _outcome(self) -> str:
        if self.operation == "sync":
            return (
                "The operation did not commit (after a crash it may show as committed: "
                "the disk may have kept it); every earlier commit is intact."
            )
        return "The operation did not commit; every earlier commit is intact."

    def _advice(self) -> str:
        return "Check the disk and the system log (dmesg), then retry"


class DiskFullError(StorageError):
    """The disk holding the database is full; the operation did not commit.

    .. versionadded:: 0.2.0
    """

    def _problem(self) -> str:
        return f"the disk is full (ENOSPC; SQLite {self.code})"

    def _advice(self) -> str:
        return "Free space on that disk, or move the database to a larger one, then retry"


class NotSupportedError(DurableError):
    """The operation is not available on this database's backend (yet).

    .. versionadded:: 0.2.0
    """

    def __init__(self, feature: str, backend: str) -> None:
        self.feature = feature
        self.backend = backend
        msg = (
            f"{feature} is not supported on {backend} yet; use an SQLite database "
            "(Store('state.db')) for agents that need it"
        )
        super().__init__(msg)


class DatabaseUnavailableError(DurableError):
    """The database server could not be reached, did not answer in time, or the
    connection broke mid-operation.

    A condition that may pass, so retrying can help: the server did not answer
    (down, restarting, frozen, a network cut, a host name that did not resolve)
    or answered that it cannot take the connection now (starting up, too many
    connections). A server that answers with a refusal that lasts (no such
    database or role, a wrong password) raises :class:`DatabaseAccessError`
    instead. Every call waits for the server up to the Store's
    ``statement_timeout`` (opening a Store: ``wait_for_database``) before
    raising this.

    The operation did not commit: a commit whose answer was lost is checked on
    a new connection, and is either reported as done or raises this saying it
    did not land (:class:`CommitUnknownError` when even the check could not
    reach the server). Every earlier commit is intact.

    Attributes:
        location: The database, without its password.
        reason: What failed, in one line.

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        location: str,
        reason: str,
        *,
        opening: bool = False,
        advice: str | None = None,
        outcome: str | None = None,
    ) -> None:
        self.location = location
        self.reason = reason
        if opening:
            outcome = outcome or "Nothing was read or written"
            advice = advice or (
                "Check that the server is up and that the URL names its host and port, then retry"
            )
        else:
            outcome = outcome or "The operation did not commit; every earlier commit is intact"
            advice = advice or "Check that the server is up, then retry"
        super().__init__(f"cannot reach the database {location}: {reason}. {outcome}. {advice}.")


class CommitUnknownError(DatabaseUnavailableError):
    """A turn's commit was sent, its answer was lost, and the server could not be
    reached to check whether it landed.

    Nothing is lost either way, and nothing is applied twice: the agent in
    memory stays at its last known commit, and its next turn reads the
    database first (it loads the turn if it landed). Do not repeat the turn's
    request before checking (``Store.versions(agent_id)``): it may have landed.

    Attributes:
        agent_id: The agent whose turn it was.
        version: The version the commit would have made.

    .. versionadded:: 0.2.0
    """

    def __init__(self, location: str, reason: str, *, agent_id: str, version: int) -> None:
        self.agent_id = agent_id
        self.version = version
        super().__init__(
            location,
            reason,
            outcome=(
                f"The commit of version {version} of agent {agent_id!r} was sent and its "
                "answer lost, and the server could not be reached to check whether it "
                "landed; the agent's next turn reads the database first and goes on "
                "from whichever it finds"
            ),
            advice=(
                f"Look before repeating the turn: Store.versions({agent_id!r}) (or "
                "`effectful-durable versions DB AGENT`) once the server answers"
            ),
        )


type AccessProblem = Literal[
    "missing-database", "missing-role", "authentication", "not-permitted", "settings"
]


class DatabaseAccessError(DurableError):
    """The database server answered, and refused what the URL asks for; retrying cannot help.

    Raised when a Store opens a ``postgresql://`` URL, at once (without the wait
    for a server that does not answer): the URL names a database or a role the
    server does not have, its credentials are refused, the server's rules
    (``pg_hba.conf``, the ``CONNECT`` privilege, ``LOGIN``) keep the role out, or
    the URL's settings are invalid. Unlike
    :class:`DatabaseUnavailableError`, trying again with the same URL fails the
    same way until someone changes the URL or the server. Nothing was read or
    written.

    ``problem`` says which, for a program to act on (create the database, ask
    for a password):

    - ``"missing-database"``: no database of that name on the server;
    - ``"missing-role"``: no role of that name (with password authentication the
      server reports a wrong user name as ``"authentication"`` instead);
    - ``"authentication"``: the password (or other credential) was refused, or
      none was given where one is needed;
    - ``"not-permitted"``: the role exists and was authenticated, or could have
      been, but may not connect (``pg_hba.conf``, ``CONNECT``, ``LOGIN``), or
      may not create (or migrate) our tables in the schema (``CREATE``);
    - ``"settings"``: the URL, or libpq's ``PG*`` environment variables, ask
      for something invalid.

    ``reason`` is the server's (or libpq's) own words, ``advice`` what to do.

    >>> error = DatabaseAccessError(
    ...     "postgresql://app@db/agents",
    ...     'database "agents" does not exist',
    ...     problem="missing-database",
    ...     advice="Create it (`createdb -h db -U app agents`)",
    ... )
    >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
    cannot connect to postgresql://app@db/agents: database "agents" does not exist.
    Create it (`createdb -h db -U app agents`); retrying will not help until then.

    .. versionadded:: 0.2.0
    """

    def __init__(self, location: str, reason: str, *, problem: AccessProblem, advice: str) -> None:
        self.location = location
        self.reason = reason
        self.problem: AccessProblem = problem
        self.advice = advice
        msg = (
            f"cannot connect to {location}: {reason}. {advice}; retrying will not help until then."
        )
        super().__init__(msg)
