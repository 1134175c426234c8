"""The parts of encryption at rest, alone: sealing a value for its row, and the key store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import commit_message, commit_writes

from effectful_durable import ContentErasedError, DamagedRowError, KeyUnavailableError, Store
from effectful_durable.store.keys import Keys, KeyStore, LocalMasterKey
from effectful_durable.store.parts.memory import MemoryChanges
from effectful_durable.store.sealing import MESSAGE, STATE, Sealer, is_sealed, key_id_of


@pytest.fixture
def sealer(tmp_path: Path) -> Sealer:
    return Sealer(KeyStore(str(tmp_path / "k.keys"), LocalMasterKey(os.urandom(32))), "db")


class TestSealing:
    def test_round_trip_and_no_plain_text(self, sealer: Sealer) -> None:
        """A sealed value holds none of its text, and opens back exactly where it belongs."""
        text = '{"content":"AnnSecret4711 \\u00e9 \\ud83d"}'
        sealed = sealer.seal(text, MESSAGE, "ann", "c", 3)
        assert is_sealed(sealed) and "AnnSecret" not in sealed and key_id_of(sealed)
        assert sealer.open(sealed, MESSAGE, "ann", "c", 3.0, table="messages") == text
        assert sealer.seal(text, MESSAGE, "ann", "c", 3) != sealed  # a fresh nonce each time

    @pytest.mark.parametrize(
        "place",
        [(MESSAGE, "bob", "c", 3), (MESSAGE, "ann", "d", 3), (MESSAGE, "ann", "c", 4),
         (STATE, "ann", "c", 3)],
        ids=["agent", "conversation", "position", "kind"],
    )  # fmt: skip
    def test_elsewhere_is_damage(self, sealer: Sealer, place: tuple[str, str, str, int]) -> None:
        """A value read as another agent's, conversation's, position's or kind's fails."""
        sealed = sealer.seal("x", MESSAGE, "ann", "c", 3)
        with pytest.raises(DamagedRowError, match="does not authenticate"):
            sealer.open(sealed, *place, table="messages")

    def test_flipped_and_cut(self, sealer: Sealer) -> None:
        """A changed character, a cut value, or text that is no base64 is damage."""
        sealed = sealer.seal("hello", STATE, "ann")
        flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
        for bad in (flipped, sealed[:30], sealed[:-1] + "!"):
            with pytest.raises(DamagedRowError):
                sealer.open(bad, STATE, "ann", table="versions")

    def test_plain_values(self, sealer: Sealer) -> None:
        """A plain value reads as it is, unless every row is sealed: then it is damage."""
        assert sealer.open('{"a":1}', STATE, "ann", table="versions") == '{"a":1}'
        sealer.complete = True
        with pytest.raises(DamagedRowError, match="is not sealed"):
            sealer.open('{"a":1}', STATE, "ann", table="versions")

    def test_without_keys(self, sealer: Sealer) -> None:
        """A Store without keys refuses a sealed value, saying what to do."""
        sealed = sealer.seal("x", STATE, "ann")
        with pytest.raises(KeyUnavailableError, match="keys="):
            Sealer(None, "db").open(sealed, STATE, "ann", table="versions")


class TestKeyStore:
    def test_keys_per_scope_and_erasure(self, tmp_path: Path) -> None:
        """Each scope has its key; destroying a scope's keys makes its values say erased,
        in this process and in another that had them in memory, and only its values."""
        master = LocalMasterKey(os.urandom(32))
        path = str(tmp_path / "k.keys")
        one, two = Sealer(KeyStore(path, master), "db"), Sealer(KeyStore(path, master), "db")
        ann = one.seal("ann's", MESSAGE, "ann", "c", 1)
        bob = one.seal("bob's", MESSAGE, "bob", "c", 1)
        assert key_id_of(ann) != key_id_of(bob)
        assert two.open(ann, MESSAGE, "ann", "c", 1, table="messages") == "ann's"
        assert one.destroy(["ann"], []) == 1
        for sealer in (one, two):
            with pytest.raises(ContentErasedError, match="erased"):
                sealer.open(ann, MESSAGE, "ann", "c", 1, table="messages")
            assert sealer.open(bob, MESSAGE, "bob", "c", 1, table="messages") == "bob's"
        assert b"ann's" not in Path(path).read_bytes()

    def test_wrong_master_key_and_rewrap(self, tmp_path: Path) -> None:
        """Another master key cannot unwrap; after a rewrap, only the new one can."""
        path = str(tmp_path / "k.keys")
        first, second = LocalMasterKey(os.urandom(32)), LocalMasterKey(os.urandom(32))
        sealed = Sealer(KeyStore(path, first), "db").seal("x", STATE, "ann")
        with pytest.raises(KeyUnavailableError, match="not the one"):
            Sealer(KeyStore(path, second), "db").open(sealed, STATE, "ann", table="versions")
        assert KeyStore(path, first).rewrap(second) == 1
        assert Sealer(KeyStore(path, second), "db").open(sealed, STATE, "ann", table="v") == "x"

    def test_key_files_and_variables(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A master key comes from a key file or a variable, as base64 of 32 bytes."""
        text = LocalMasterKey.generate()
        (tmp_path / "m.key").write_text(text + "\n")
        monkeypatch.setenv("EFFECTFUL_DURABLE_KEY", text)
        assert Keys.from_file(tmp_path / "m.key").master.id == Keys.from_env().master.id
        assert text not in repr(Keys.from_env())
        monkeypatch.setenv("EFFECTFUL_DURABLE_KEY", "c2hvcnQ=")
        with pytest.raises(KeyUnavailableError, match="32 bytes"):
            Keys.from_env()

    def test_a_key_management_service_behind_master_key(self, tmp_path: Path) -> None:
        """Any object with ``id``, ``wrap`` and ``unwrap`` is a master key (a KMS): the
        data keys are wrapped by it alone, and its refusal to unwrap is one clear error."""

        class FakeKms:
            """A remote KMS, as seen from here: it keeps the keys, and hands out handles."""

            id = "kms-test"

            def __init__(self) -> None:
                self.held: dict[bytes, tuple[bytes, str]] = {}
                self.down = False

            def wrap(self, data_key: bytes, label: str) -> bytes:
                handle = os.urandom(16)
                self.held[handle] = (data_key, label)
                return handle

            def unwrap(self, wrapped: bytes, label: str) -> bytes:
                if self.down:
                    raise ConnectionError("the KMS did not answer")
                key, wrapped_for = self.held[wrapped]
                if wrapped_for != label:
                    raise PermissionError("wrapped for another label")
                return key

        kms = FakeKms()
        db = str(tmp_path / "state.db")
        with Store(db, keys=Keys(kms, store=str(tmp_path / "kms.keys"))) as store:
            commit_message(store, "ann", "AnnSecret4711")
        assert kms.held and b"AnnSecret" not in (tmp_path / "state.db").read_bytes()
        with Store(db, keys=Keys(kms, store=str(tmp_path / "kms.keys"))) as store:
            assert store.history("ann")[0]["content"] == "AnnSecret4711"
        kms.down = True
        with pytest.raises(KeyUnavailableError, match="did not answer") as refused:
            Store(db, keys=Keys(kms, store=str(tmp_path / "kms.keys")))
        assert "\n" not in str(refused.value)

    def test_a_commit_looks_at_the_key_store_once(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A turn's commit seals its state, messages and every staged write after one
        look at the key store (what other processes made or erased), not one a value."""
        keys = Keys(LocalMasterKey(os.urandom(32)), store=str(tmp_path / "k.keys"))
        with Store(tmp_path / "state.db", keys=keys) as store:
            commit_message(store, "ann", "hello")
            looks: list[int] = []
            key_store = store.sealer.keys
            assert key_store is not None
            refresh = key_store.refresh  # this Store's alone: other threads have stores too
            monkeypatch.setattr(key_store, "refresh", lambda: looks.append(1) or refresh())
            changes = MemoryChanges()
            changes.changes = {("key", f"k{n}"): f'"v{n}"' for n in range(10)}
            commit_writes(store, "ann", changes)
            assert looks == [1]
            assert store.memory("ann") == {f"k{n}": f"v{n}" for n in range(10)}
