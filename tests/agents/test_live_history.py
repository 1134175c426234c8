"""History: the live history logs what a turn changed, and every edit reaches the database."""

import random
from collections import OrderedDict
from typing import Any

from effectful.handlers.llm.completions import _get_history, completion
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements
from helpers import Assistant, NewDatabases, persisted
from hypothesis import given, settings
from hypothesis import strategies as st

from effectful_durable import Store
from effectful_durable.agents.history import History
from effectful_durable.store.history import _without_cache_hints
from effectful_durable.testing import FakeLLM


def msg(key: str, text: str = "", role: str = "user") -> dict[str, Any]:
    return {"id": key, "role": role, "content": [{"type": "text", "text": text or key}]}


class TestLog:
    def test_copy_written_back_logs_appends_and_replacements(self) -> None:
        """A copy edited and written back, as effectful does, logs its appends and replacements."""
        history = History((k, msg(k)) for k in "abc")
        history.mark_committed()
        draft = history.copy()
        draft["d"] = msg("d")
        draft["b"] = msg("b", "changed")
        history.clear()
        history.update(draft)
        changes = history.changes()
        assert changes is not None
        assert (changes.appended, changes.replaced) == (["d"], ["b"])
        assert list(history) == ["a", "b", "c", "d"]

    def test_direct_assignment_is_logged(self) -> None:
        """Assigning an item of the live history is logged too."""
        history = History((k, msg(k)) for k in "ab")
        history.mark_committed()
        history["a"] = msg("a", "new")
        history["z"] = msg("z")
        changes = history.changes()
        assert changes is not None
        assert (changes.appended, changes.replaced) == (["z"], ["a"])

    def test_other_edits_make_the_log_unknown(self) -> None:
        """Deleting, reordering, or writing back a foreign mapping leaves no log to trust."""
        edits = [
            lambda h: h.__delitem__("a"),
            lambda h: h.pop("a"),
            lambda h: h.popitem(),
            lambda h: h.move_to_end("a"),
            lambda h: (h.clear(), h.update(OrderedDict(a=msg("a")))),
        ]
        for edit in edits:
            history = History((k, msg(k)) for k in "ab")
            history.mark_committed()
            edit(history)
            assert history.changes() is None

    def test_stale_copy_is_not_adopted(self) -> None:
        """A copy taken before another change was written back is not trusted."""
        history = History((k, msg(k)) for k in "ab")
        history.mark_committed()
        stale = history.copy()
        stale["c"] = msg("c")
        history["x"] = msg("x")
        history.clear()
        history.update(stale)
        assert history.changes() is None

    def test_copy_of_copy_edits_are_not_logged_on_the_original(self) -> None:
        """A copy of a copy (RetryLLMHandler's scratch) never counts as the original's change."""
        history = History((k, msg(k)) for k in "ab")
        history.mark_committed()
        draft = history.copy()
        scratch = draft.copy()
        scratch["junk"] = msg("junk")
        history.clear()
        history.update(draft)
        changes = history.changes()
        assert changes is not None
        assert (changes.appended, changes.replaced) == ([], [])


class Editor(ObjectInterpretation):
    """Edits the history effectful is working on, at every model request, as told."""

    def __init__(self, rng: random.Random, edits: int) -> None:
        self.rng, self.edits = rng, edits

    @implements(completion)
    def _completion(self, *args: Any, **kwargs: Any) -> Any:
        edit_randomly(_get_history(), self.rng, self.edits)
        return fwd()


def edit_randomly(history: Any, rng: random.Random, edits: int) -> None:
    for _ in range(edits):
        keys = list(history)
        key = rng.choice(keys)
        kind = rng.choice(["rewrite", "mark", "delete", "front", "append", "reload"])
        if kind == "rewrite":
            history[key] = {**history[key], "content": f"rewritten {rng.random()}"}
        elif kind == "mark":
            content = history[key].get("content")
            if isinstance(content, list) and content:
                marked = {**content[-1], "cache_control": {"type": "ephemeral"}}
                history[key] = {**history[key], "content": [*content[:-1], marked]}
        elif kind == "delete" and len(keys) > 2:
            del history[key]
        elif kind == "front":
            history.move_to_end(key, last=False)
        elif kind == "append":
            new = f"extra-{rng.random()}"
            history[new] = msg(new)
        elif kind == "reload":
            items = list(history.items())
            history.clear()
            history.update(items)


def plain(messages: Any) -> list[Any]:
    return [_without_cache_hints(m) for m in messages]


class TestEditsReachTheDatabase:
    def test_random_edits_anywhere_are_recorded_exactly(self, new_databases: NewDatabases) -> None:
        """Random edits anywhere in a long history, in turns and between them, reach the
        database, also on an agent object just loaded from it."""

        @settings(max_examples=new_databases.examples(10), deadline=None)
        @given(
            seed=st.integers(0, 2**32),
            plan=st.lists(
                st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()),
                min_size=3,
                max_size=12,
            ),
        )
        def check(seed: int, plan: list[tuple[int, int, bool]]) -> None:
            with new_databases() as db:
                edit_and_compare(db, random.Random(seed), plan)

        check()


def edit_and_compare(db: str, rng: random.Random, plan: list[tuple[int, int, bool]]) -> None:
    bot = Assistant(agent_id="edited")
    llm = FakeLLM(respond=lambda call: "ok")
    with persisted(db, llm) as persistence:
        for i in range(40):  # a long history first
            bot.ask(f"question {i}")
        for during, between, reload in plan:
            if reload:  # a new object for the same agent, as another process would
                bot = Assistant(agent_id="edited")
                persistence.load(bot)
                stored = persistence.store.history("edited")
                assert plain(stored) == plain(bot.__history__.values())
            edit_randomly(bot.__history__, rng, between)
            with handler(Editor(rng, during)):
                bot.ask("next")
            stored = persistence.store.history("edited")
            assert plain(stored) == plain(bot.__history__.values())
    with Store(db) as store:
        assert plain(store.history("edited")) == plain(bot.__history__.values())
