"""StateTools: the model's memory tools, staging per turn, __memory__, the digest, threads."""

import dataclasses
import json
import math
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from helpers import Keeper, integrity, persisted, persisted_rows

from effectful_durable import (
    DurableError,
    MemoryDigest,
    MemoryLimits,
    MemoryWriteError,
    Store,
)
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall


@dataclasses.dataclass
class Small(Keeper):
    """You keep little."""

    __memory_limits__: ClassVar[MemoryLimits] = MemoryLimits(
        key_chars=10, value_bytes=20, keys=2, note_chars=30, notes=2, listed_keys=3
    )


@dataclasses.dataclass
class Quiet(Keeper):
    """You are told nothing of your memory."""

    __memory_digest__: ClassVar[MemoryDigest | None] = None


def put(key: str, value: Any) -> ToolCall:
    return ToolCall("put_state", {"key": key, "value": value})


def turn(llm_script: list[Any], *calls: ToolCall | list[ToolCall]) -> None:
    """Append to a script one turn that makes ``calls`` (one request each), then answers."""
    llm_script.extend([*calls, "done"])


def tool_texts(call: FakeCall) -> list[str]:
    """The texts of the tool results at the end of a request."""
    out = []
    for message in reversed(call.messages):
        if message["role"] != "tool":
            break
        out.append("".join(block["text"] for block in message["content"]))
    return out[::-1]


def results(llm: FakeLLM) -> list[str]:
    """The tool results of every request, in order."""
    return [text for call in llm.calls for text in tool_texts(call)]


def memory_rows(store_url: str) -> list[tuple[Any, ...]]:
    return persisted_rows(store_url, "SELECT * FROM memory ORDER BY agent_id, kind, key, added_in")


def system_text(call: FakeCall) -> str:
    [system] = [m for m in call.messages if m["role"] == "system"]
    return "\n".join(block["text"] for block in system["content"])


def run_turns(store_url: str, agent: Keeper, *turns: list[Any]) -> FakeLLM:
    """Run one ask() per script in ``turns``; return the fake model."""
    llm = FakeLLM([reply for script in turns for reply in script])
    with persisted(store_url, llm):
        for n, _ in enumerate(turns):
            assert agent.ask(f"q{n}") == "done"
    return llm


class TestTools:
    """Each tool, called by the model, does what its description says."""

    def test_put_get_list_delete(self, store_url: str) -> None:
        """The model stores, reads, lists and deletes keys; memory commits with the turn."""
        bot = Keeper(agent_id="bot")
        llm = run_turns(
            store_url,
            bot,
            [
                [put("user.name", '"Alice"'), put("user.tz", '"UTC"'), put("todo", "[1, 2]")],
                "done",
            ],
            [
                [
                    ToolCall("get_state", {"key": "user.name"}),
                    ToolCall("list_state_keys", {"prefix": "user."}),
                    ToolCall("delete_state_key", {"key": "todo"}),
                    ToolCall("list_state_keys", {}),
                ],
                "done",
            ],
        )
        assert results(llm) == [
            "stored 'user.name' (7 bytes); your memory holds 1 key.",
            "stored 'user.tz' (5 bytes); your memory holds 2 keys.",
            "stored 'todo' (5 bytes); your memory holds 3 keys.",
            '"Alice"',
            "keys starting with 'user.':\nuser.name (7 bytes)\nuser.tz (5 bytes)",
            "deleted 'todo'; your memory holds 2 keys.",
            "keys:\nuser.name (7 bytes)\nuser.tz (5 bytes)",
        ]
        with Store(store_url, readonly=True) as store:
            assert store.memory("bot", 1) == {
                "todo": [1, 2],
                "user.name": "Alice",
                "user.tz": "UTC",
            }
            assert store.memory("bot") == {"user.name": "Alice", "user.tz": "UTC"}

    @pytest.mark.parametrize(
        "text",
        ['"caf\u00e9 \u2615"', "-1.5e3", "true", "null", '{"a": [1, {"b": null}]}', "[]", "0"],
    )
    def test_any_json_value_round_trips(self, store_url: str, text: str) -> None:
        """Every kind of JSON value is stored and read back as it was given."""
        bot = Keeper(agent_id="bot")
        llm = run_turns(
            store_url, bot, [put("k", text), ToolCall("get_state", {"key": "k"}), "done"]
        )
        assert json.loads(results(llm)[1]) == json.loads(text)
        with Store(store_url, readonly=True) as store:
            assert store.memory("bot") == {"k": json.loads(text)}

    def test_overwrite_says_replaced(self, store_url: str) -> None:
        """Putting an existing key replaces its value and says so."""
        bot = Keeper(agent_id="bot")
        llm = run_turns(store_url, bot, [put("k", "1"), "done"], [put("k", "2"), "done"])
        assert results(llm)[-1] == "replaced 'k' (1 bytes); your memory holds 1 key."
        with Store(store_url, readonly=True) as store:
            assert [store.memory("bot", v) for v in (1, 2)] == [{"k": 1}, {"k": 2}]

    def test_tools_reach_only_their_agents_memory(self, store_url: str) -> None:
        """An agent's tools neither read nor change another agent's keys and notes, even
        where its id matches the other's as a LIKE pattern would."""
        owner = [put("plan", '"secret"'), ToolCall("add_to_context", {"item": "mine"})]
        run_turns(store_url, Keeper(agent_id="alice"), [owner, "done"])
        before = memory_rows(store_url)
        snoop = [
            ToolCall("get_state", {"key": "plan"}),
            ToolCall("list_state_keys", {"prefix": ""}),
            ToolCall("delete_state_key", {"key": "plan"}),
            ToolCall("clear_old_context", {"older_than_seconds": 0}),
        ]
        llm = run_turns(store_url, Keeper(agent_id="alic_"), [snoop, "done"])
        got, listed, deleted, cleared = results(llm)
        assert "holds no key 'plan'" in got and "nothing was deleted" in deleted
        assert "plan" not in listed and cleared.startswith("removed 0 notes")
        assert memory_rows(store_url) == before
        with Store(store_url, readonly=True) as store:
            assert store.memory("alice") == {"plan": "secret"}
            assert store.memory("alic_") == {}

    def test_list_is_capped(self, store_url: str) -> None:
        """list_state_keys returns at most listed_keys keys and says more exist."""
        bot = Small(agent_id="bot")
        llm = run_turns(
            store_url,
            bot,
            [[put("a", "1"), put("b", "2")], ToolCall("list_state_keys", {}), "done"],
        )
        assert results(llm)[-1] == "keys:\na (1 bytes)\nb (1 bytes)"
        bot2 = Keeper(agent_id="bot2")
        llm = FakeLLM(
            [[put(f"k{i:02}", "1") for i in range(205)], ToolCall("list_state_keys", {}), "done"]
        )
        with persisted(store_url, llm):
            bot2.ask("q")
        listing = results(llm)[-1].splitlines()
        assert len(listing) == 1 + 200 + 1
        assert listing[-1].startswith("... and more")

    def test_context_notes(self, store_url: str) -> None:
        """add_to_context keeps timestamped notes; clear_old_context removes the old ones."""
        bot = Keeper(agent_id="bot")
        llm = run_turns(
            store_url,
            bot,
            [
                ToolCall("add_to_context", {"item": "User prefers metric units."}),
                ToolCall("add_to_context", {"item": "Meeting moved to Friday."}),
                "done",
            ],
            [ToolCall("clear_old_context", {"older_than_seconds": 3600}), "done"],
            [ToolCall("clear_old_context", {"older_than_seconds": 0}), "done"],
        )
        texts = results(llm)
        assert texts[0].startswith("added a note at ") and texts[0].endswith("1 note.")
        assert texts[1].endswith("your context holds 2 notes.")
        assert texts[2:] == [
            "removed 0 notes; your context holds 2 notes.",
            "removed 2 notes; your context holds 0 notes.",
        ]
        with Store(store_url, readonly=True) as store:
            notes = store.memory_notes("bot", 1)
            assert [n.text for n in notes] == [
                "User prefers metric units.",
                "Meeting moved to Friday.",
            ]
            assert notes[0].at <= notes[1].at
            assert store.memory_notes("bot") == []
            assert store.memory("bot") == {}


BAD_CALLS = [
    (put("k", "Alice"), "is not JSON text"),
    (put("k", "{"), "is not JSON text"),
    (put("k", "NaN"), "NaN is not a JSON number"),
    (put("k", "[" * 100_000 + "]" * 100_000), "error: the value is"),
    (put("", "1"), "must be 1-10 characters; got 0"),
    (put("k" * 11, "1"), "must be 1-10 characters; got 11"),
    (put("a\nb", "1"), "non-printable"),
    (put(" a", "1"), "whitespace"),
    (put("k", '"' + "x" * 30 + '"'), "32 bytes as JSON; the limit is 20 bytes"),
    (put("k", '"' + "x" * 1000 + '"'), "the limit is 20 bytes"),
    (put("new", "1"), "holds 2 keys, the limit"),
    (ToolCall("delete_state_key", {"key": "gone"}), "holds no key 'gone'; nothing was deleted"),
    (ToolCall("delete_state_key", {"key": ""}), "must be 1-10 characters"),
    (ToolCall("get_state", {"key": "gone"}), "holds no key 'gone'"),
    (ToolCall("list_state_keys", {"prefix": "p" * 11}), "at most 10 characters"),
    (ToolCall("add_to_context", {"item": ""}), "the note is empty"),
    (ToolCall("add_to_context", {"item": "   "}), "the note is empty"),
    (ToolCall("add_to_context", {"item": "n" * 31}), "31 characters; the limit is 30"),
    (ToolCall("add_to_context", {"item": "third"}), "holds 2 notes, the limit"),
    (ToolCall("clear_old_context", {"older_than_seconds": -1}), "must be a number >= 0"),
    (ToolCall("clear_old_context", {"older_than_seconds": -0.5}), "must be a number >= 0"),
]


class TestBadInput:
    """Each bad tool input is an error text the model reads; the turn goes on, writing nothing."""

    @pytest.fixture
    def full(self, store_url: str) -> Path:
        """A Small agent at version 1 holding its 2 keys and 2 notes (the limits)."""
        run_turns(
            store_url,
            Small(agent_id="bot"),
            [
                [put("a", "1"), put("b", '"x"')],
                ToolCall("add_to_context", {"item": "one"}),
                ToolCall("add_to_context", {"item": "two"}),
                "done",
            ],
        )
        return store_url

    @pytest.mark.parametrize(
        ("call", "error"), BAD_CALLS, ids=[f"{c.name}-{i}" for i, (c, _) in enumerate(BAD_CALLS)]
    )
    def test_error_text_and_no_write(self, full: Path, call: ToolCall, error: str) -> None:
        """The tool returns an error naming the problem; the memory on disk is unchanged."""
        before = memory_rows(full)
        llm = run_turns(full, Small(agent_id="bot"), [call, "done"])
        [text] = results(llm)
        assert text.startswith("error: ") and error in text, text
        assert memory_rows(full) == before
        with Store(full, readonly=True) as store:
            assert store.versions("bot")[-1].version == 2  # the turn itself committed
        assert integrity(full) == "ok"

    def test_bad_input_amid_good_writes(self, full: Path) -> None:
        """A refused call in a turn leaves the turn's other writes to commit."""
        llm = run_turns(
            full,
            Small(agent_id="bot"),
            [
                [put("a", "oops"), put("a", "2"), ToolCall("delete_state_key", {"key": "zz"})],
                "done",
            ],
        )
        assert [t.split(" ")[0] for t in results(llm)] == ["error:", "replaced", "error:"]
        with Store(full, readonly=True) as store:
            assert store.memory("bot") == {"a": 2, "b": "x"}


class TestStaging:
    """Writes are staged in the turn and commit with it, or not at all."""

    def test_reads_in_a_turn_see_its_writes(self, store_url: str) -> None:
        """A later request of the same turn reads the staged value; the disk has none yet."""
        seen: list[Any] = []

        def peek(call: FakeCall) -> Any:
            seen.append(persisted_rows(store_url, "SELECT count(*) FROM memory")[0][0])
            return "done"

        llm = FakeLLM([put("k", "1"), ToolCall("get_state", {"key": "k"})], respond=peek)
        with persisted(store_url, llm):
            Keeper(agent_id="bot").ask("q")
        assert results(llm)[1] == "1"
        assert seen == [0]  # staged, not written, while the turn runs
        assert persisted_rows(store_url, "SELECT key, value FROM memory") == [("k", "1")]

    @pytest.mark.parametrize("error", [RuntimeError("model down"), KeyboardInterrupt()])
    def test_failed_turn_leaves_memory_as_it_was(
        self, store_url: str, error: BaseException
    ) -> None:
        """A turn that raises after staging writes leaves memory exactly at its last commit."""
        bot = Keeper(agent_id="bot")
        run_turns(store_url, bot, [put("k", "1"), "done"])
        before = memory_rows(store_url)
        llm = FakeLLM(
            [
                [put("k", "2"), put("new", "3"), ToolCall("add_to_context", {"item": "n"})],
                error,
                ToolCall("get_state", {"key": "k"}),
                "done",
            ]
        )
        with persisted(store_url, llm):
            with pytest.raises(type(error)):
                bot.ask("fails")
            assert memory_rows(store_url) == before
            assert bot.ask("again") == "done"
        assert results(llm)[-1] == "1"
        with Store(store_url, readonly=True) as store:
            assert store.memory("bot") == {"k": 1}
            assert store.memory_notes("bot") == []

    def test_developer_writes_commit_with_the_turn(self, store_url: str) -> None:
        """__memory__.put inside a tool stages the write; it commits with the turn."""
        bot = Keeper(agent_id="bot")
        llm = FakeLLM([ToolCall("note_by_code", {"key": "x", "value": 7}), "done"])
        with persisted(store_url, llm):
            bot.ask("q")
            assert dict(bot.__memory__) == {"x": 7}
            assert bot.__memory__["x"] == 7 and "x" in bot.__memory__ and len(bot.__memory__) == 1
        with Store(store_url, readonly=True) as store:
            assert store.memory("bot") == {"x": 7}

    def test_developer_api_in_a_turn(self, store_url: str) -> None:
        """Inside a turn the mapping shows staged writes; bad values raise MemoryWriteError."""
        bot = Keeper(agent_id="bot")
        observed: dict[str, Any] = {}

        def respond(call: FakeCall) -> str:
            memory = bot.__memory__
            memory.put("a", {"n": 1})
            memory.put("b", [1])
            memory.delete("b")
            with pytest.raises(MemoryWriteError, match="not JSON"):
                memory.put("c", object())
            with pytest.raises(MemoryWriteError, match="not JSON"):
                memory.put("c", math.nan)
            with pytest.raises(MemoryWriteError, match="characters; got 0"):
                memory.put("", 1)
            with pytest.raises(KeyError):
                memory.delete("nope")
            note = memory.add_note("remember me")
            observed.update(view=dict(memory), notes=memory.notes, note=note)
            observed["count"] = memory.clear_notes(older_than=3600)
            with pytest.raises(ValueError, match="finite"):
                memory.clear_notes(older_than=-1)
            return "done"

        with persisted(store_url, FakeLLM(respond=respond)):
            bot.ask("q")
        assert observed["view"] == {"a": {"n": 1}}
        assert observed["notes"] == [observed["note"]] and observed["count"] == 0
        with Store(store_url, readonly=True) as store:
            assert store.memory("bot") == {"a": {"n": 1}}
            assert store.memory_notes("bot") == [observed["note"]]

    def test_outside_a_turn_memory_is_read_only(self, store_url: str) -> None:
        """Between turns __memory__ reads the committed memory and refuses writes."""
        bot = Keeper(agent_id="bot")
        with persisted(store_url, FakeLLM([put("k", "1"), "done"])):
            bot.ask("q")
            memory = bot.__memory__
            assert dict(memory) == {"k": 1}
            with pytest.raises(DurableError, match="no turn of it runs in this thread"):
                memory.put("k", 2)
            with pytest.raises(DurableError, match="no turn of it runs"):
                bot.__memory__.add_note("x")
            fresh = Keeper(agent_id="never-ran")
            assert dict(fresh.__memory__) == {}

    def test_without_persistence_handler_it_is_an_error(self) -> None:
        """Without PersistenceHandler, __memory__ and the tools raise a clear DurableError."""
        bot = Keeper(agent_id="bot")
        with pytest.raises(DurableError, match="install PersistenceHandler"):
            dict(bot.__memory__)
        with pytest.raises(DurableError, match="install PersistenceHandler"):
            bot.get_state("k")

    def test_a_view_from_an_ended_turn_refuses_use(self, store_url: str) -> None:
        """A memory view kept after its turn ended raises instead of reading stale writes."""
        bot = Keeper(agent_id="bot")
        kept = []

        def respond(call: FakeCall) -> str:
            kept.append(bot.__memory__)
            return "done"

        with persisted(store_url, FakeLLM(respond=respond)):
            bot.ask("q")
            with pytest.raises(DurableError, match="belongs to a turn that has ended"):
                dict(kept[0])

    def test_rollback_and_fork_reach_the_agent(self, store_url: str) -> None:
        """After a rollback the agent's tools read the old memory; a fork reads its copy."""
        bot = Keeper(agent_id="bot")
        llm = FakeLLM(
            [put("k", "1"), "done", put("k", "2"), "done"]
            + [ToolCall("get_state", {"key": "k"}), "done"] * 2
        )
        with persisted(store_url, llm) as persistence:
            bot.ask("one")
            bot.ask("two")
            persistence.store.rollback("bot", 1)
            persistence.store.fork("bot", 2, "copy")
            bot.ask("three")
            Keeper(agent_id="copy").ask("four")
        assert results(llm)[-2:] == ["1", "2"]


class TestDigest:
    """The system message of each request summarises the memory, outside the history."""

    def test_digest_lists_keys_values_and_notes(self, store_url: str) -> None:
        """Small values show in full, large ones by size; notes with their time; not in history."""
        bot = Keeper(agent_id="bot")
        big = '"' + "x" * 500 + '"'
        llm = run_turns(
            store_url,
            bot,
            [
                [put("name", '"Alice"'), put("essay", big)],
                ToolCall("add_to_context", {"item": "Likes tea."}),
                "done",
            ],
        )
        first, second, third = (system_text(call) for call in llm.calls)
        assert "Your memory" not in first and "Your context" not in first  # empty: no digest
        assert '- name = "Alice"' in second and "- essay: text, 502 bytes" in second
        assert "holds 2 keys" in second and "Likes tea." not in second
        assert "Your context notes" in third and "UTC] Likes tea." in third
        with Store(store_url, readonly=True) as store:
            assert "Your memory" not in str(store.history("bot"))

    def test_digest_is_bounded(self, store_url: str) -> None:
        """With many keys and notes the digest keeps to its limits and says what it left out."""
        bot = Keeper(agent_id="bot")
        notes = [ToolCall("add_to_context", {"item": f"note {i} " + "y" * 150}) for i in range(60)]
        llm = run_turns(
            store_url,
            bot,
            [[put(f"key{i:03}", '"' + "v" * 50 + '"') for i in range(300)], notes, "done"],
        )
        digest = system_text(llm.calls[-1]).split("You keep what you learn.", 1)[1]
        keys_part, notes_part = digest.split("\n\nYour context notes")
        assert len(keys_part) <= MemoryDigest().chars + 100
        assert "holds 300 keys" in keys_part and "more keys; list_state_keys" in keys_part
        assert keys_part.count("\n- key") <= MemoryDigest().keys
        assert len(notes_part) <= MemoryDigest().note_chars + 100
        assert "older notes not shown" in notes_part
        assert "note 59 " in notes_part and "note 0 " not in notes_part  # newest kept

    def test_digest_can_be_turned_off(self, store_url: str) -> None:
        """With __memory_digest__ = None the system message says nothing of memory."""
        bot = Quiet(agent_id="bot")
        llm = run_turns(store_url, bot, [put("k", "1"), "done"], ["done"])
        assert all("Your memory" not in system_text(call) for call in llm.calls)


class TestThreads:
    """Agents in parallel threads write their own memory; nothing is lost."""

    def test_parallel_agents_keep_every_write(self, store_url: str) -> None:
        """Four agents, each in its own thread, commit ten turns of writes each."""
        turns, workers = 10, 4
        Store(store_url).close()
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                script = [
                    reply
                    for t in range(turns)
                    for reply in ([put(f"t{t}", str(t)), put("last", str(t))], "done")
                ]
                with persisted(store_url, FakeLLM(script), wait=5.0):
                    bot = Keeper(agent_id=f"bot{n}")
                    for t in range(turns):
                        bot.ask(f"turn {t}")
            except BaseException as e:  # reported below, with the thread's traceback
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        with Store(store_url, readonly=True) as store:
            for n in range(workers):
                expected = {f"t{t}": t for t in range(turns)} | {"last": turns - 1}
                assert store.memory(f"bot{n}") == expected
                for v in range(1, turns + 1):
                    assert store.memory(f"bot{n}", v)["last"] == v - 1
        assert integrity(store_url) == "ok"
