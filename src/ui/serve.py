"""``effectful-durable ui``: open the database read-only, print the address, serve the page."""

from __future__ import annotations

import argparse
import getpass
import logging
import secrets
import socket
import sys
import webbrowser
from types import FrameType

import uvicorn

from ..errors import DurableError
from ..store import Keys, Store
from ..store.engine.seam import redacted
from .app import make_app
from .guard import loopback
from .live import CommitFeed


def serve(args: argparse.Namespace) -> int:
    """Serve the page for ``args`` (``db``, ``host``, ``port``, ``no_browser``,
    ``read_only``, ``by``) until Ctrl-C. The database is opened first, read-only,
    then (unless ``read_only``) read-write for the actions: what is wrong with it is
    raised here (a DurableError), before anything is bound or printed.

    Returns:
        The exit code: 0 after Ctrl-C.
    """
    location = redacted(args.db)
    by = args.by if args.by is not None else getpass.getuser()
    if not by.strip():
        msg = "--by needs a name: the decisions made in the page are kept under it"
        raise DurableError(msg)
    # On PostgreSQL, one connection each: the page's requests and its watch take turns
    # on the reader's, so that it holds 2 however many tabs are open (see production.rst).
    keys = Keys.from_environment()  # an encrypted database: as the commands take it
    store = Store(args.db, readonly=True, pool_size=1, keys=keys)
    writer = None
    try:
        # Opened after the read-only Store, which refuses a database to migrate: so the
        # read-write one only opens a database as it is, and changes it only when asked.
        writer = None if args.read_only else Store(args.db, pool_size=1, keys=keys)
        listener = _bind(args.host, args.port)
        port = int(listener.getsockname()[1])
        token = secrets.token_urlsafe(24)
        hosts = frozenset() if loopback(args.host) else frozenset({args.host})
        app = make_app(
            store,
            token=token,
            port=port,
            writer=writer,
            by=by,
            hosts=hosts,
            location=location,
            check_report=getattr(args, "check_report", None),
        )
        shown = f"[{args.host}]" if ":" in args.host else args.host
        if args.host in ("0.0.0.0", "::"):
            shown = "127.0.0.1"
        url = f"http://{shown}:{port}/?token={token}"
        if not loopback(args.host):
            print(
                f"effectful-durable: warning: serving on {args.host}, not only this machine: "
                "anyone who can reach it and learns the address's token sees every agent's "
                "conversations",
                file=sys.stderr,
            )
        mode = " (read-only)" if args.read_only else f" (deciding as {by})"
        print(f"effectful-durable ui: {location}{mode}")
        print(f"open {url}")
        print("Ctrl-C stops it.", flush=True)
        if not args.no_browser:
            webbrowser.open(url)
        config = uvicorn.Config(
            app,
            log_level=logging.WARNING,
            access_log=False,
            timeout_graceful_shutdown=1,
            lifespan="on",
        )
        _Server(config, app.state.feed).run(sockets=[listener])
    finally:
        if writer is not None:
            writer.close()
        store.close()
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, which ends the pages' live streams as soon as it is asked to stop:
    otherwise it would wait for them, and then cancel them with an error."""

    def __init__(self, config: uvicorn.Config, feed: CommitFeed) -> None:
        super().__init__(config)
        self._feed = feed

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._feed.close_streams()
        super().handle_exit(sig, frame)


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (port 0: one the system picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        msg = f"cannot listen on {host}:{port}: {error.strerror or error}"
        raise OSError(msg) from error
    listener.listen(128)
    listener.set_inheritable(True)
    return listener
