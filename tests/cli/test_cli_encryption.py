"""The commands on an encrypted database: the key from the environment, ``encrypt`` and
``rotate-key``; without the key, one line and nothing written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers import commit_message, persisted_rows

from effectful_durable import Keys, LocalMasterKey, Store
from effectful_durable.cli import main


def sealed(db: Path) -> list[bool]:
    return [str(b).startswith("ed1:") for (b,) in persisted_rows(db, "SELECT body FROM messages")]


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "master.key"
    path.write_text(LocalMasterKey.generate())
    for name in (
        "EFFECTFUL_DURABLE_KEY_FILE",
        "EFFECTFUL_DURABLE_KEY",
        "EFFECTFUL_DURABLE_KEY_STORE",
    ):
        monkeypatch.delenv(name, raising=False)
    return path


class TestEncryptedCommands:
    def test_encrypt_then_read_and_rotate(
        self,
        db_path: Path,
        key_file: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """``encrypt`` seals a plain database; reads then need the key; ``rotate-key``
        seals again, and ``--new-key-file`` hands the database to another master key."""
        with Store(db_path) as store:
            for n in range(3):
                commit_message(store, "bot", f"secret {n}")
        monkeypatch.setenv("EFFECTFUL_DURABLE_KEY_FILE", str(key_file))
        assert main(["encrypt", str(db_path), "--batch", "2"]) == 0
        assert "every row is sealed" in capsys.readouterr().out
        assert all(sealed(db_path))
        assert main(["history", str(db_path), "bot", "--json"]) == 0
        assert "secret 2" in capsys.readouterr().out
        new_key = key_file.with_name("new.key")
        new_key.write_text(LocalMasterKey.generate())
        assert main(["rotate-key", str(db_path), "--new-key-file", str(new_key)]) == 0
        assert "wrapped" in capsys.readouterr().out
        monkeypatch.setenv("EFFECTFUL_DURABLE_KEY_FILE", str(new_key))
        assert main(["history", str(db_path), "bot", "--json"]) == 0
        assert "secret 0" in capsys.readouterr().out
        with Store(db_path, keys=Keys.from_file(new_key)) as store:
            assert len(store.history("bot")) == 3

    def test_without_the_key_one_line_and_nothing_written(
        self,
        db_path: Path,
        key_file: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """No key, or another one: an error line naming what to set; the file unchanged."""
        with Store(db_path, keys=Keys.from_file(key_file)) as store:
            commit_message(store, "bot", "secret")
        before = hashlib.sha256(db_path.read_bytes()).hexdigest()
        for command in (["history", str(db_path), "bot"], ["rotate-key", str(db_path)]):
            assert main(command) == 1
            err = capsys.readouterr().err.strip()
            assert "\n" not in err and "EFFECTFUL_DURABLE_KEY_FILE" in err, err
        other = key_file.with_name("other.key")
        other.write_text(LocalMasterKey.generate())
        monkeypatch.setenv("EFFECTFUL_DURABLE_KEY_FILE", str(other))
        assert main(["agents", str(db_path)]) == 1
        assert "not the ones" in capsys.readouterr().err
        assert hashlib.sha256(db_path.read_bytes()).hexdigest() == before
