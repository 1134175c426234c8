"""Sealing stored content: AES-GCM under a data key, bound to the row it belongs to.

A sealed value is text, so that it fits the columns plain values use on both
engines: ``ed1:<key id>:<base64(nonce | ciphertext | tag)>``; in a column of
bytes (a workspace changeset, a history snapshot) the same without base64. The
associated data is the row's identity (its kind, agent, conversation and place:
a message's position, a memory key, an approval's column...), so that a value
moved to another agent, conversation or place, or a byte flipped anywhere in it,
fails to open: damage, never a different value. The cipher is the
``cryptography`` package's AES-GCM with a random 96-bit nonce per value (NIST SP
800-38D: well under 2**32 values per key). JSON never starts with ``ed1:``, which
is how a value written before encryption is told apart.

A :class:`Sealer` is what the Store's modules call: :data:`PLAIN` for a database
without encryption (it refuses a sealed value it meets), or one made from
:class:`~.keys.Keys` and the database's key store.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..errors import ContentErasedError, DamagedRowError, KeyUnavailableError
from .keys import DATABASE_SCOPE, KeyStore

PREFIX = "ed1:"
_PREFIX_BYTES = PREFIX.encode()
_NONCE = 12
_TAG = 16

#: The kinds of sealed content, as bound into each value.
MESSAGE, STATE, HANDOFF, CHECK = "message", "state", "handoff", "check"
MEMORY, FIELDS, APPROVAL, ALARM = "memory", "fields", "approval", "alarm"
JOURNAL, WORKSPACE, SNAPSHOT = "journal", "workspace", "snapshot"

#: The kinds sealed under their conversation's data key (the others: the agent's),
#: so that erasing a conversation alone destroys the key of what it holds.
PER_CONVERSATION = frozenset({MESSAGE, HANDOFF, FIELDS, APPROVAL, JOURNAL, SNAPSHOT})

#: What a database's check value holds, sealed: opening it proves the keys.
_CHECK_TEXT = "effectful-durable encryption check"


def is_sealed(value: str | bytes) -> bool:
    """Whether ``value`` is a sealed value (and not plain text)."""
    if isinstance(value, bytes):
        return value.startswith(_PREFIX_BYTES)
    return value.startswith(PREFIX)


def key_id_of(value: str | bytes) -> str:
    """The id of the data key a sealed ``value`` was sealed with ("" if it is plain)."""
    if not is_sealed(value):
        return ""
    if isinstance(value, bytes):
        return value[len(PREFIX) : value.find(b":", len(PREFIX))].decode("ascii", "replace")
    return value[len(PREFIX) : value.find(":", len(PREFIX))]


def place(kind: str, agent_id: str, conversation: str = "", where: Any = "") -> bytes:
    """The associated data of a value: its kind, agent, conversation and place in them."""
    # A unit separator cannot occur in an id (ids.py refuses control characters).
    if isinstance(where, int | float):  # a position: the same text whichever it came as
        where = repr(float(where))
    return f"{kind}\x1f{agent_id}\x1f{conversation}\x1f{where}".encode()


class Sealer:
    """Seals the content a database's rows hold, and opens it again.

    Args:
        keys: The database's key store, or None for a database without encryption.
        location: The database, as messages name it.
        complete: Every row of the database is sealed: a plain value where a sealed
            one belongs was put there by hand, and is refused as damage.
    """

    def __init__(self, keys: KeyStore | None, location: str, *, complete: bool = False) -> None:
        self.keys = keys
        self.location = location
        self.complete = complete
        self._local = threading.local()

    @property
    def enabled(self) -> bool:
        """Whether new rows are sealed."""
        return self.keys is not None

    @contextlib.contextmanager
    def one_look(self) -> Iterator[None]:
        """One look at the key store, for every value this thread seals or opens in the
        block (one write, or one read): the keys other processes made or erased since.
        Outside such a block, each value looks on its own."""
        if self.keys is None or self._looked:
            yield
            return
        self.keys.refresh()
        self._local.looked = True
        try:
            yield
        finally:
            self._local.looked = False

    def listed[T](self, rows: Iterable[Any], make: Callable[[Any], T]) -> list[T]:
        """``make`` of each row (opening what it holds), with one look at the key store,
        leaving out the rows whose content was erased: what a list across agents shows
        in a copy made before an erasure."""
        made: list[T] = []
        with self.one_look():
            for row in rows:
                with contextlib.suppress(ContentErasedError):
                    made.append(make(row))
        return made

    @property
    def _looked(self) -> bool:
        return bool(getattr(self._local, "looked", False))

    def seal(
        self, text: str, kind: str, agent_id: str, conversation: str = "", where: Any = ""
    ) -> str:
        """``text`` sealed for its row (unchanged without encryption)."""
        if self.keys is None:
            return text
        key_id, sealed = self._seal(text.encode(), kind, agent_id, conversation, where)
        return f"{PREFIX}{key_id}:{base64.b64encode(sealed).decode('ascii')}"

    def seal_bytes(
        self, data: bytes, kind: str, agent_id: str, conversation: str = "", where: Any = ""
    ) -> bytes:
        """``data`` sealed for its row, as bytes (``ed1:<key id>:`` and the raw sealed
        bytes); unchanged without encryption."""
        if self.keys is None:
            return data
        key_id, sealed = self._seal(data, kind, agent_id, conversation, where)
        return b"%b%b:%b" % (_PREFIX_BYTES, key_id.encode("ascii"), sealed)

    def _seal(
        self, data: bytes, kind: str, agent_id: str, conversation: str, where: Any
    ) -> tuple[str, bytes]:
        assert self.keys is not None
        scope_conversation = conversation if kind in PER_CONVERSATION else ""
        data_key = self.keys.current(agent_id, scope_conversation, fresh=not self._looked)
        nonce = os.urandom(_NONCE)
        sealed = data_key.cipher.encrypt(nonce, data, place(kind, agent_id, conversation, where))
        return data_key.id, nonce + sealed

    def open(
        self,
        value: str | bytes,
        kind: str,
        agent_id: str,
        conversation: str = "",
        where: Any = "",
        *,
        table: str,
        version: int | None = None,
    ) -> str:
        """The plain text of ``value``, read from a row of ``table``.

        Raises:
            DamagedRowError: It does not open for this row: changed, or moved from
                another; or it is plain where every row is sealed.
            ContentErasedError: Its data key was destroyed by an erasure.
            KeyUnavailableError: It is sealed and this Store has no key for it.
        """
        if not is_sealed(value):
            if self.complete:
                raise self._damaged(table, agent_id, conversation, version, "is not sealed")
            return value.decode() if isinstance(value, bytes) else value
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if self.keys is None:
            msg = (
                f"{self.location} holds encrypted content: open it with keys= "
                "(Keys.from_file, Keys.from_env) to read it"
            )
            raise KeyUnavailableError(msg)
        try:
            _, key_id, body = text.split(":", 2)
            raw = base64.b64decode(body, validate=True)
        except (ValueError, binascii.Error):
            raise self._damaged(
                table, agent_id, conversation, version, "is not a sealed value"
            ) from None
        return self._decrypt(
            key_id, raw, kind, agent_id, conversation, where, table, version
        ).decode()

    def open_bytes(
        self,
        value: bytes,
        kind: str,
        agent_id: str,
        conversation: str = "",
        where: Any = "",
        *,
        table: str,
        version: int | None = None,
    ) -> bytes:
        """The plain bytes of ``value`` (sealed by :meth:`seal_bytes`), read from ``table``.

        Raises:
            As :meth:`open`.
        """
        if not is_sealed(value):
            if self.complete:
                raise self._damaged(table, agent_id, conversation, version, "is not sealed")
            return value
        if self.keys is None:
            self.open(value[:4], kind, agent_id, table=table)  # raises: no keys
        cut = value.find(b":", len(PREFIX))
        return self._decrypt(
            value[len(PREFIX) : cut].decode("ascii", "replace"),
            memoryview(value)[cut + 1 :],  # not copied: a snapshot is megabytes
            kind,
            agent_id,
            conversation,
            where,
            table,
            version,
        )

    def _decrypt(
        self,
        key_id: str,
        raw: bytes | memoryview,
        kind: str,
        agent_id: str,
        conversation: str,
        where: Any,
        table: str,
        version: int | None,
    ) -> bytes:
        assert self.keys is not None
        if len(raw) < _NONCE + _TAG:
            raise self._damaged(table, agent_id, conversation, version, "is cut short")
        try:
            cipher = self.keys.cipher(key_id, fresh=not self._looked)
        except KeyUnavailableError as error:
            if error.erased:
                raise ContentErasedError(self.location, table, agent_id, conversation) from None
            raise
        from cryptography.exceptions import InvalidTag

        try:
            plain: bytes = cipher.decrypt(
                raw[:_NONCE], raw[_NONCE:], place(kind, agent_id, conversation, where)
            )
        except InvalidTag:
            raise self._damaged(
                table,
                agent_id,
                conversation,
                version,
                "does not authenticate (changed, or moved from another row)",
            ) from None
        return plain

    def open_messages(
        self, rows: Iterable[tuple[float, str | bytes]], agent_id: str, conversation: str
    ) -> Iterator[tuple[float, str | bytes]]:
        """``(position, body)`` rows of one conversation, their bodies opened."""
        if self.keys is None and not self.complete:  # a plain database: as it was
            yield from rows
            return
        if self.keys is None:  # complete, and no keys: refuse as open() does
            for position, body in rows:
                yield position, self.open(body, MESSAGE, agent_id, conversation, table="messages")
            return
        # A long history's load: open() inlined, the associated data's head made once,
        # the ciphers looked up once a key, the plain bytes handed to the JSON decoder.
        from cryptography.exceptions import InvalidTag

        keys, ciphers = self.keys, dict[bytes, Any]()
        keys.refresh()
        head = f"{MESSAGE}\x1f{agent_id}\x1f{conversation}\x1f"
        a2b = binascii.a2b_base64
        for position, body in rows:
            text = body if isinstance(body, bytes) else body.encode("ascii", "replace")
            cut = text.find(b":", 4) if text.startswith(_PREFIX_BYTES) else -1
            cipher = None
            if cut > 0:
                key_id = text[4:cut]
                cipher = ciphers.get(key_id)
                if cipher is None:
                    with contextlib.suppress(KeyUnavailableError):
                        cipher = keys.cipher(key_id.decode("ascii", "replace"), fresh=False)
                        ciphers[key_id] = cipher
            plain = None
            if cipher is not None:
                try:
                    raw = a2b(text[cut + 1 :], strict_mode=True)
                    aad = (head + repr(float(position))).encode()
                    plain = cipher.decrypt(raw[:_NONCE], raw[_NONCE:], aad)
                except (ValueError, binascii.Error, InvalidTag):
                    plain = None
            if plain is None:  # not sealed, damaged or erased: open() says which
                yield (
                    position,
                    self.open(body, MESSAGE, agent_id, conversation, position, table="messages"),
                )
            else:
                yield position, plain

    def destroy(self, agents: Sequence[str], conversations: Sequence[tuple[str, str]]) -> int:
        """Destroy the data keys of ``agents`` and ``conversations``; how many there were."""
        if self.keys is None:
            return 0
        return len(self.keys.destroy(agents, conversations))

    def _damaged(
        self, table: str, agent_id: str, conversation: str, version: int | None, why: str
    ) -> DamagedRowError:
        return DamagedRowError(
            self.location, table, agent_id, conversation or None, version, reason=why
        )

    # -- the database's check value ------------------------------------------------

    def check_value(self) -> str:
        """A new check value for the database: proves later that keys are the ones."""
        if self.keys is None:
            msg = "no keys: nothing to seal with"
            raise KeyUnavailableError(msg)
        data_key = self.keys.current(*DATABASE_SCOPE)
        nonce = os.urandom(_NONCE)
        sealed = data_key.cipher.encrypt(
            nonce, (_CHECK_TEXT + secrets.token_hex(8)).encode(), place(CHECK, "")
        )
        return f"{PREFIX}{data_key.id}:{base64.b64encode(nonce + sealed).decode('ascii')}"

    def verify(self, check: str) -> None:
        """Refuse keys that cannot open the database's check value ``check``.

        Raises:
            KeyUnavailableError: No keys given, or not the ones that sealed the database.
        """
        if self.keys is None:
            msg = (
                f"{self.location} is encrypted: open it with keys= (Keys.from_file, "
                "Keys.from_env); nothing was read or written"
            )
            raise KeyUnavailableError(msg)
        try:
            plain = self.open(check, CHECK, "", table="encryption")
        except (KeyUnavailableError, DamagedRowError) as error:
            why = error.args[0] if isinstance(error, KeyUnavailableError) else "it does not open"
            msg = (
                f"the keys given are not the ones {self.location} was encrypted with "
                f"({why}); key store {self.keys.path}; nothing was read or written"
            )
            raise KeyUnavailableError(msg) from None
        if not plain.startswith(_CHECK_TEXT):
            msg = f"the check value of {self.location} is not ours; nothing was written"
            raise KeyUnavailableError(msg)


#: The sealer of a database without encryption.
PLAIN = Sealer(None, "")
