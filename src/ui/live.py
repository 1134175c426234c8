"""Live pages: the store's commit watch, turned into server-sent events.

One watch per server (``Store.watch_commits``: ``PRAGMA data_version`` on
SQLite, the statistics of our tables on PostgreSQL, polled) bumps a counter; each
open page holds one ``/-/live`` stream that waits on it and sends ``event: commit``
when it moves. The page's htmx then fetches its own address again and swaps in
what changed; ``static/live.js`` keeps the folds the person opened or closed.
An idle page costs nothing but a comment every :data:`KEEPALIVE` seconds, and
a burst of commits reaches a page at most once per :data:`SPACING` seconds, so
that a busy writer never makes the pages load the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ..store import Store
from ..store.engine.seam import CommitWatch

#: Seconds between two events sent to one page, at most one per commit burst.
SPACING = 0.3
#: Seconds between two comments on an idle stream (they find closed connections).
KEEPALIVE = 15.0


class CommitFeed:
    """A counter of the commits the store's watch reported, that streams can wait on."""

    def __init__(self) -> None:
        self.count = 0
        self.closing = False
        self._changed: asyncio.Event | None = None
        self._watch: CommitWatch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, store: Store) -> None:
        """Start watching ``store`` (in the event loop that serves the streams)."""
        loop = self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

        def wake() -> None:  # from the watch's thread
            loop.call_soon_threadsafe(self._bump)

        self._watch = store.watch_commits(wake)

    def stop(self) -> None:
        """Stop watching."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def close_streams(self) -> None:
        """End every open stream (the server is stopping); callable from any thread."""
        if self._loop is not None and not self.closing:
            self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        self.closing = True
        self._bump()

    def _bump(self) -> None:
        self.count += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def changed_since(self, seen: int, timeout: float) -> bool:
        """Whether a commit came after the count ``seen``, waiting up to ``timeout`` seconds."""
        if self.count != seen or self._changed is None:
            return self.count != seen
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return False
        return True


def stream(request: Request) -> StreamingResponse:
    """``/-/live``: an ``event: commit`` after each burst of commits, until the page closes."""
    feed: CommitFeed = request.app.state.feed

    async def events() -> AsyncIterator[str]:
        seen = feed.count
        yield "retry: 1000\n\n"
        while not feed.closing:
            if await feed.changed_since(seen, KEEPALIVE):
                if feed.closing:
                    return
                seen = feed.count
                yield f"event: commit\ndata: {seen}\n\n"
                await asyncio.sleep(SPACING)
            else:
                yield ": idle\n\n"

    headers = {"X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
