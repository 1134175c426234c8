"""The commands on an encrypted database: the key from the environment, ``encrypt`` and
``rotate-key``; without the key, one line and nothing written."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import keeper
import pytest
from helpers import commit_message, persisted_rows

from effectful_durable import Keys, LocalMasterKey, Store
from effectful_durable.cli import main

#: What differs between two runs of a check, whatever the databases hold.
_RUN_FIELDS = {"database", "checked_at", "seconds"}


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

    def test_check_upgrade_reads_a_sealed_database_as_a_plain_one(
        self,
        tmp_path: Path,
        key_file: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """``check-upgrade`` opens what agents hold in flight (tool calls, results, fields,
        memory, events) with the key from the environment: the same report as for the
        same work in a plain database (its events, delivered by an on_event the
        keeper lacks, are found as breaks in both)."""
        reports = []
        for name, keys in (("plain", None), ("sealed", Keys.from_file(key_file))):
            db = tmp_path / name / "state.db"
            db.parent.mkdir()
            keeper.fill(str(db), "ann", keys)
            if keys is not None:
                monkeypatch.setenv("EFFECTFUL_DURABLE_KEY_FILE", str(key_file))
            status = main(["check-upgrade", str(db), "--agents", "keeper:make", "--json"])
            out, err = capsys.readouterr()
            assert out, err
            report = json.loads(re.sub(r"\bevt_[0-9a-f]+", "evt", out.replace(str(db), "DB")))
            reports.append(
                {k: v for k, v in report.items() if k not in _RUN_FIELDS} | {"": status}
            )
        assert reports[0] == reports[1]
        assert reports[0]["in_flight"]["agents"] == 3
