"""plan_change: the rows a commit adds and removes reproduce the new history exactly."""

import gc
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectful_durable.store.history import ActiveHistory, plan_change
from effectful_durable.store.rows import decode_messages as _decode_messages
from effectful_durable.store.rows import decode_positioned

_ids = itertools.count()


def message(text: str = "") -> dict[str, Any]:
    n = next(_ids)
    return {"id": f"m{n}", "role": "user", "content": text or f"message {n}"}


class Table:
    """An in-memory model of the messages table: rows are never deleted."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.version = 0

    def apply(self, change: Any) -> None:
        self.version += 1
        for low, high in change.removed:
            for row in self.active():
                if low <= row["position"] <= high:
                    row["removed_in"] = self.version
        for position, msg in change.added:
            self.rows.append(
                {"position": position, "added_in": self.version, "removed_in": None, "msg": msg}
            )

    def active(self) -> list[dict[str, Any]]:
        return sorted(
            (r for r in self.rows if r["removed_in"] is None), key=lambda r: r["position"]
        )


def commit(table: Table, old: ActiveHistory, new: list[dict[str, Any]]) -> ActiveHistory:
    change, after = plan_change(old, new)
    table.apply(change)
    active = table.active()
    positions = [r["position"] for r in active]
    assert [r["msg"] for r in active] == new
    assert positions == after.positions == sorted(set(positions))
    assert after.messages == new
    return after


edits = st.lists(
    st.tuples(
        st.sampled_from(["keep", "drop", "rewrite"]),
        st.integers(min_value=0, max_value=3),  # messages inserted after this one
    ),
    max_size=30,
)


def edited(old: list[dict[str, Any]], plan: list[tuple[str, int]]) -> list[dict[str, Any]]:
    new: list[dict[str, Any]] = [message() for _ in range(plan[0][1])] if plan else []
    padded = itertools.chain(plan, itertools.repeat(("keep", 0)))
    for msg, (action, inserted) in zip(old, padded, strict=False):
        if action == "keep":
            new.append(msg)
        elif action == "rewrite":
            new.append({**msg, "content": msg["content"] + " (rewritten)"})
        new.extend(message() for _ in range(inserted))
    return new


class TestPlanChange:
    def test_append_only_turn_adds_rows_and_removes_none(self) -> None:
        """A turn that only appends writes exactly the appended messages."""
        old = [message() for _ in range(5)]
        table = Table()
        history = commit(table, ActiveHistory(), old)
        change, _ = plan_change(history, [*old, message(), message()])
        assert len(change.added) == 2 and change.removed == [] and change.removed_count == 0

    def test_rewritten_message_keeps_its_place(self) -> None:
        """A message rewritten in place is replaced at the same position."""
        old = [message() for _ in range(4)]
        table = Table()
        history = commit(table, ActiveHistory(), old)
        new = [old[0], {**old[1], "content": "edited"}, old[2], old[3]]
        change, after = plan_change(history, new)
        assert change.removed_count == 1 and len(change.added) == 1
        assert after.positions == history.positions

    def test_cache_hints_alone_are_not_a_change(self) -> None:
        """A message that only gained effectful's cache_control hint keeps its row."""
        old = [message() for _ in range(3)]
        old[2]["content"] = [{"type": "text", "text": "tool result"}]
        table = Table()
        history = commit(table, ActiveHistory(), old)
        hinted = {
            **old[2],
            "content": [
                {"type": "text", "text": "tool result", "cache_control": {"type": "ephemeral"}}
            ],
        }
        change, after = plan_change(history, [old[0], old[1], hinted, message()])
        assert change.removed == [] and [m for _, m in change.added] == [after.messages[3]]
        assert after.messages[2] is hinted

    def test_summary_replaces_a_range(self) -> None:
        """Replacing a run of messages with one summary removes a single range."""
        old = [message() for _ in range(10)]
        table = Table()
        history = commit(table, ActiveHistory(), old)
        summary = message("summary")
        change, _ = plan_change(history, [old[0], summary, *old[7:]])
        assert change.removed == [(history.positions[1], history.positions[6])]
        assert change.removed_count == 6
        assert [m for _, m in change.added] == [summary]

    def test_repeated_inserts_in_one_gap_stay_ordered(self) -> None:
        """Hundreds of inserts between the same two messages never break the order."""
        first, last = message(), message()
        table = Table()
        history = commit(table, ActiveHistory(), [first, last])
        middle: list[dict[str, Any]] = []
        for _ in range(300):
            middle.append(message())
            history = commit(table, history, [first, *middle, last])

    @settings(max_examples=300, deadline=None)
    @given(rounds=st.lists(edits, min_size=1, max_size=6))
    def test_any_sequence_of_edits_round_trips(self, rounds: list[list[tuple[str, int]]]) -> None:
        """Whatever a turn keeps, drops, rewrites or inserts, the active rows equal it."""
        table = Table()
        history = ActiveHistory()
        current: list[dict[str, Any]] = []
        for plan in rounds:
            current = edited(current, plan) or [message()]
            history = commit(table, history, current)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


class TestDecodingStoredMessages:
    """Messages read back from the database equal what json.loads makes of them."""

    @given(st.lists(st.dictionaries(st.text(), JSON_VALUES, max_size=5), max_size=5))
    @settings(max_examples=200, deadline=None)
    def test_same_values_as_json(self, messages: list[dict[str, Any]]) -> None:
        bodies = [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in messages]
        assert _decode_messages(iter(bodies)) == [json.loads(b) for b in bodies]

    def test_escaped_lone_surrogate_still_decodes(self) -> None:
        """pydantic-core refuses an escaped lone surrogate, which json accepts."""
        assert _decode_messages(iter(['{"text":"\\ud800"}'])) == [{"text": "\ud800"}]

    def test_the_collector_is_as_it_was_after_decoding(self) -> None:
        """Decoding holds off the garbage collector and leaves it as it found it."""
        bodies = ['{"id":"a"}', '{"id":"b"}']
        seen: list[bool] = []

        def watched() -> Any:
            for body in bodies:
                seen.append(gc.isenabled())
                yield body

        assert gc.isenabled()
        _decode_messages(watched())
        assert seen == [False, False] and gc.isenabled()
        with pytest.raises(ValueError):
            _decode_messages(iter(["{not json"]))
        assert gc.isenabled()
        gc.disable()
        try:
            _decode_messages(iter(bodies))
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_rows_with_positions_decode_in_order(self) -> None:
        """(position, body) rows give their positions and messages in the rows' order."""
        rows = [(0.0, '{"id":"a"}'), (0.5, '{"text":"\\ud800"}'), (3.0, '{"id":"c","n":[1]}')]
        assert decode_positioned(iter(rows)) == (
            [0.0, 0.5, 3.0],
            [{"id": "a"}, {"text": "\ud800"}, {"id": "c", "n": [1]}],
        )
