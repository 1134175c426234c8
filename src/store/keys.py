"""The keys of encryption at rest: a master key that wraps data keys, kept apart from the data.

- A **master key** wraps and unwraps data keys and never seals a row: a key
  file or an environment variable (:class:`LocalMasterKey`: 32 random bytes,
  base64), or a key management service the application calls (anything with
  ``id``, ``wrap`` and ``unwrap``: :class:`MasterKey`). Its id is kept beside
  every key it wrapped.
- A **data key** seals rows (``sealing.py``). Each *scope* has its own: an
  agent (its fields), and each of its conversations (their messages and
  handoffs), so that erasing an agent or one conversation destroys exactly
  the keys of what it erases.
- The **key store** keeps the data keys, wrapped, outside the database: an
  SQLite file of its own (by default beside an SQLite database, ``<db>.keys``).
  A copy of the database (a backup, a file copy, ``pg_dump``) holds no key, so
  destroying a scope's keys here makes every copy of its rows unreadable; the
  key store then keeps only the erased key's random id and when, so that
  reading such a copy says "erased", not "damaged".

It imports nothing of ours but the errors.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import apsw

from ..errors import KeyUnavailableError

_KEY_BYTES = 32
#: The environment variable :meth:`Keys.from_env` reads by default.
KEY_VARIABLE = "EFFECTFUL_DURABLE_KEY"
#: Where the commands and the page look for a key file, and for the key store.
KEY_FILE_VARIABLE = "EFFECTFUL_DURABLE_KEY_FILE"
KEY_STORE_VARIABLE = "EFFECTFUL_DURABLE_KEY_STORE"


class MasterKey(Protocol):
    """What wraps data keys: a local key, or a key management service (KMS).

    ``label`` names the data key's scope; implementations bind the wrapping to
    it (associated data), so that a wrapped key moved to another scope does not
    unwrap. ``unwrap`` raises :class:`~effectful_durable.KeyUnavailableError`
    (or any exception, which is reported as one) for a key it did not wrap.

    .. versionadded:: 0.2.0
    """

    #: Names this master key in the key store (not secret).
    id: str

    def wrap(self, data_key: bytes, label: str) -> bytes:
        """``data_key`` wrapped (encrypted) for ``label``."""
        ...

    def unwrap(self, wrapped: bytes, label: str) -> bytes:
        """The data key ``wrapped`` holds; raises if this master key did not wrap it."""
        ...


class LocalMasterKey:
    """A master key held by this process: 32 bytes, given as base64 text.

    Example::

        text = LocalMasterKey.generate()      # keep it in a file or a secret store
        master = LocalMasterKey.from_text(text, "my key file")

    Args:
        key: The 32-byte key.

    Raises:
        ValueError: The key is not 32 bytes.

    .. versionadded:: 0.2.0
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            msg = (
                f"a master key is {_KEY_BYTES} bytes (base64: 44 characters); "
                f"this one is {len(key)}"
            )
            raise ValueError(msg)
        self._key = key
        #: A digest that tells two keys apart (not secret).
        self.id = (
            "local-" + hashlib.sha256(b"effectful-durable master key id\0" + key).hexdigest()[:16]
        )

    def __repr__(self) -> str:
        return f"LocalMasterKey({self.id})"  # never the key

    @classmethod
    def generate(cls) -> str:
        """A new random key, as the base64 text a key file or variable holds."""
        return base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode("ascii")

    @classmethod
    def from_text(cls, text: str, where: str) -> LocalMasterKey:
        """The key in ``text`` (base64), read from ``where`` (named in errors).

        Raises:
            KeyUnavailableError: It is not base64 of 32 bytes.
        """
        try:
            return cls(base64.b64decode(text.strip(), validate=True))
        except ValueError as error:
            msg = f"the master key in {where} is not the base64 text of 32 bytes ({error})"
            raise KeyUnavailableError(msg) from None

    def wrap(self, data_key: bytes, label: str) -> bytes:
        """``data_key`` sealed with AES-GCM under this key, bound to ``label``."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        return nonce + AESGCM(self._key).encrypt(nonce, data_key, label.encode())

    def unwrap(self, wrapped: bytes, label: str) -> bytes:
        """The data key in ``wrapped``.

        Raises:
            KeyUnavailableError: This key did not wrap it (a wrong key), or it was changed.
        """
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            return AESGCM(self._key).decrypt(wrapped[:12], wrapped[12:], label.encode())
        except InvalidTag:
            msg = "the master key given is not the one that wrapped the data keys"
            raise KeyUnavailableError(msg) from None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS data_keys (
    key_id       TEXT PRIMARY KEY NOT NULL,
    agent_id     TEXT NOT NULL,
    conversation TEXT NOT NULL,
    wrapped      BLOB NOT NULL,
    master_id    TEXT NOT NULL,
    created_at   REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS data_keys_scope ON data_keys (agent_id, conversation, created_at);
CREATE TABLE IF NOT EXISTS erased_keys (
    key_id    TEXT PRIMARY KEY NOT NULL,
    erased_at REAL NOT NULL
) STRICT;
"""

#: The scope of the database's own check value (no agent id can be empty).
DATABASE_SCOPE = ("", "")


@dataclass(frozen=True, slots=True)
class DataKey:
    """A data key, unwrapped: its id (in the rows it sealed) and its AES-GCM cipher."""

    id: str
    cipher: Any


def _cipher(key: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _label(agent_id: str, conversation: str) -> str:
    # A unit separator cannot occur in an id (ids.py refuses control characters).
    return f"effectful-durable data key\x1f{agent_id}\x1f{conversation}"


class KeyStore:
    """The data keys of one database, wrapped by the master key, in an SQLite file of their own.

    Safe for many threads and processes: each thread has its own connection, and
    a change another process commits (a new key, an erasure) is seen at the next
    use (SQLite's ``data_version``), so no process keeps sealing with a key
    another one destroyed.

    Args:
        path: The key file; created if missing.
        master: What wraps and unwraps the keys.

    .. versionadded:: 0.2.0
    """

    def __init__(self, path: str, master: MasterKey, *, create: bool = True) -> None:
        if not create and not os.path.exists(path):
            msg = (
                f"the key store {path} is missing: give Keys(..., store=PATH) where the "
                "database's data keys are kept; nothing was written"
            )
            raise KeyUnavailableError(msg)
        self.path = path
        self.master = master
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[apsw.Connection] = []  # every thread's, for close()
        self._keys: dict[str, Any] = {}  # key id -> its cipher
        self._current: dict[tuple[str, str], DataKey] = {}
        self._seen = -1
        self._erased = -1
        made = not os.path.exists(path)
        try:
            conn = self._conn()
            with conn:
                conn.execute(_SCHEMA)
            if made:  # wrapped keys only, but nobody else's business
                os.chmod(path, 0o600)
        except apsw.Error as error:
            msg = f"the key store {path} cannot be opened: {error}"
            raise KeyUnavailableError(msg) from error

    def _conn(self) -> apsw.Connection:
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = apsw.Connection(self.path)
            conn.set_busy_timeout(10_000)
            conn.execute("PRAGMA journal_mode = WAL")
            # What it deletes is overwritten, and a key lost is every row it sealed.
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("PRAGMA synchronous = FULL")
            self._local.conn = conn
            with self._lock:
                self._opened.append(conn)
        return conn

    def _fresh(self, conn: apsw.Connection) -> None:
        """Forget the keys held in memory if another connection changed the file since."""
        seen = int(conn.execute("PRAGMA data_version").get)
        if seen == self._seen:
            return
        # Another process made a key (a rotation: new rows get the newest), or erased
        # some: only an erasure takes the keys already unwrapped away.
        erased = int(conn.execute("SELECT count(*) FROM erased_keys").get)
        with self._lock:
            self._current.clear()
            if erased != self._erased:
                self._keys.clear()
                self._erased = erased
            self._seen = seen

    def refresh(self) -> None:
        """Notice what other processes changed in the key store since the last look."""
        self._fresh(self._conn())

    def current(self, agent_id: str, conversation: str = "", *, fresh: bool = True) -> DataKey:
        """The data key new rows of the scope are sealed with; made on first use.

        ``fresh=False`` skips the look at other processes' changes, for the
        values after the first of one write or read.
        """
        if fresh:
            self.refresh()
        scope = (agent_id, conversation)
        found = self._current.get(scope)
        if found is not None:
            return found
        conn = self._conn()
        label = _label(agent_id, conversation)
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT key_id, wrapped FROM data_keys WHERE agent_id = ? AND conversation = ?"
                " ORDER BY created_at DESC LIMIT 1",
                scope,
            ).fetchone()
            if row is None:
                key, key_id = secrets.token_bytes(_KEY_BYTES), secrets.token_hex(8)
                conn.execute(
                    "INSERT INTO data_keys VALUES (?, ?, ?, ?, ?, ?)",
                    (key_id, *scope, self.master.wrap(key, label), self.master.id, time.time()),
                )
            else:
                key_id, key = str(row[0]), self._unwrap(bytes(row[1]), label)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        # Our own commit changes no data_version of ours; other connections' do.
        data_key = DataKey(key_id, _cipher(key))
        with self._lock:
            self._current[scope] = data_key
            self._keys[key_id] = data_key.cipher
        return data_key

    def _unwrap(self, wrapped: bytes, label: str) -> bytes:
        try:
            return self.master.unwrap(wrapped, label)
        except KeyUnavailableError:
            raise
        except Exception as error:  # a KMS's own error: one kind for our callers
            msg = f"the master key {self.master.id} did not unwrap a data key: {error}"
            raise KeyUnavailableError(msg) from error

    def cipher(self, key_id: str, *, fresh: bool = True) -> Any:
        """The AES-GCM cipher of the data key ``key_id``.

        Raises:
            KeyUnavailableError: It was erased (``erased`` is True), is not in this
                key store, or the master key given did not wrap it.
        """
        if fresh:
            self.refresh()
        found = self._keys.get(key_id)
        if found is not None:
            return found
        conn = self._conn()
        row = conn.execute(
            "SELECT agent_id, conversation, wrapped FROM data_keys WHERE key_id = ?", (key_id,)
        ).fetchone()
        if row is None:
            if conn.execute("SELECT 1 FROM erased_keys WHERE key_id = ?", (key_id,)).fetchone():
                msg = f"data key {key_id} was erased"
                raise KeyUnavailableError(msg, erased=True)
            msg = f"data key {key_id} is not in the key store {self.path}"
            raise KeyUnavailableError(msg)
        cipher = _cipher(self._unwrap(bytes(row[2]), _label(str(row[0]), str(row[1]))))
        with self._lock:
            self._keys[key_id] = cipher
        return cipher

    def rotate(self, agent_id: str, conversation: str = "") -> DataKey:
        """A new data key for the scope: new rows get it; older rows keep theirs."""
        key, key_id = secrets.token_bytes(_KEY_BYTES), secrets.token_hex(8)
        label = _label(agent_id, conversation)
        conn = self._conn()
        with conn:
            conn.execute(
                "INSERT INTO data_keys VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key_id,
                    agent_id,
                    conversation,
                    self.master.wrap(key, label),
                    self.master.id,
                    time.time(),
                ),
            )
        data_key = DataKey(key_id, _cipher(key))
        with self._lock:
            self._current[(agent_id, conversation)] = data_key
            self._keys[key_id] = data_key.cipher
        return data_key

    def destroy(
        self, agents: Iterable[str], conversations: Iterable[tuple[str, str]]
    ) -> list[str]:
        """Erase every data key of ``agents`` (their conversations' too) and of
        ``conversations``, and their bytes from the file; the ids of those erased.

        The rows go with SQLite's ``secure_delete`` (their bytes overwritten) and
        the WAL is checkpointed and truncated, so no earlier state of the file holds
        them. What stays of each: its id, and when it was erased.
        """
        conn = self._conn()
        now = time.time()
        ids: list[str] = []
        with conn:
            for agent_id in agents:
                ids += [
                    str(k)
                    for (k,) in conn.execute(
                        "SELECT key_id FROM data_keys WHERE agent_id = ?", (agent_id,)
                    )
                ]
            for scope in conversations:
                ids += [
                    str(k)
                    for (k,) in conn.execute(
                        "SELECT key_id FROM data_keys WHERE agent_id = ? AND conversation = ?",
                        scope,
                    )
                ]
            for key_id in ids:
                conn.execute("INSERT OR IGNORE INTO erased_keys VALUES (?, ?)", (key_id, now))
                conn.execute("DELETE FROM data_keys WHERE key_id = ?", (key_id,))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with self._lock:
            self._keys.clear()
            self._current.clear()
        return ids

    def rewrap(self, master: MasterKey) -> int:
        """Wrap every data key with ``master`` instead, in one transaction; how many."""
        conn = self._conn()
        with conn:
            rows: list[Any] = conn.execute(
                "SELECT key_id, agent_id, conversation, wrapped FROM data_keys"
            ).fetchall()
            for row in rows:
                label = _label(str(row[1]), str(row[2]))
                key = self._unwrap(bytes(row[3]), label)
                conn.execute(
                    "UPDATE data_keys SET wrapped = ?, master_id = ? WHERE key_id = ?",
                    (master.wrap(key, label), master.id, row[0]),
                )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.master = master
        return len(rows)

    def scopes(self) -> list[tuple[str, str]]:
        """Every scope that has a data key."""
        rows = self._conn().execute("SELECT DISTINCT agent_id, conversation FROM data_keys")
        return [(str(a), str(c)) for a, c in rows]

    def close(self) -> None:
        """Close the connections to the key file, of every thread (its store closes)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()
        self._local = threading.local()


class Keys:
    """What encryption at rest needs: the master key, and where the data keys are kept.

    Give it to :class:`~effectful_durable.Store` or
    :class:`~effectful_durable.PersistenceHandler` as ``keys=``. Example::

        keys = Keys.from_file("/run/secrets/durable.key")   # or Keys.from_env()
        store = Store("state.db", keys=keys)                # data keys in state.db.keys

    Args:
        master: The master key: a :class:`LocalMasterKey`, or your key management
            service behind the :class:`~effectful_durable.store.keys.MasterKey` protocol.
        store: The key store's file. By default ``<database>.keys`` beside an
            SQLite database; required for PostgreSQL (every process of the fleet
            must reach the same key store).

    .. versionadded:: 0.2.0
    """

    def __init__(self, master: MasterKey, *, store: str | os.PathLike[str] | None = None) -> None:
        self.master = master
        self.store = None if store is None else os.fspath(store)

    def __repr__(self) -> str:
        return f"Keys({self.master.id}, store={self.store!r})"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, store: str | None = None) -> Keys:
        """The master key in the key file ``path`` (base64 text of 32 bytes).

        Raises:
            KeyUnavailableError: The file is missing, unreadable, or holds no key.
        """
        where = os.fspath(path)
        try:
            with open(where, encoding="ascii") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            msg = f"the key file {where} cannot be read: {error}"
            raise KeyUnavailableError(msg) from None
        return cls(LocalMasterKey.from_text(text, where), store=store)

    @classmethod
    def from_env(cls, name: str = KEY_VARIABLE, *, store: str | None = None) -> Keys:
        """The master key in the environment variable ``name`` (base64 text of 32 bytes).

        Raises:
            KeyUnavailableError: The variable is not set, or holds no key.
        """
        text = os.environ.get(name)
        if not text:
            msg = f"the environment variable {name} holds no master key"
            raise KeyUnavailableError(msg)
        return cls(LocalMasterKey.from_text(text, f"${name}"), store=store)

    @classmethod
    def from_environment(cls) -> Keys | None:
        """The keys the environment names for the commands and the page, or None.

        ``EFFECTFUL_DURABLE_KEY_FILE`` (a key file) or ``EFFECTFUL_DURABLE_KEY``
        (the key itself), and ``EFFECTFUL_DURABLE_KEY_STORE`` where the key store
        is not ``<db>.keys`` beside an SQLite file.

        Raises:
            KeyUnavailableError: The key named cannot be read.
        """
        store = os.environ.get(KEY_STORE_VARIABLE) or None
        if os.environ.get(KEY_FILE_VARIABLE):
            return cls.from_file(os.environ[KEY_FILE_VARIABLE], store=store)
        if os.environ.get(KEY_VARIABLE):
            return cls.from_env(KEY_VARIABLE, store=store)
        return None

    def key_store(self, database: str, *, is_file: bool, create: bool = True) -> KeyStore:
        """The key store for ``database``."""
        path = self.store
        if path is None:
            if not is_file:
                msg = (
                    f"give Keys(..., store=PATH) for {database}: "
                    "a server database has no file beside it"
                )
                raise KeyUnavailableError(msg)
            path = database + ".keys"
        return KeyStore(path, self.master, create=create)
