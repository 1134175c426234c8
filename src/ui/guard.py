"""Who may see the page: the Host check, the token exchanged for a cookie, the write gate.

One ASGI middleware in front of every route, in this order:

1. **Host.** The ``Host`` header must name this machine by a loopback name
   (``localhost``, ``127.0.0.1`` or another ``127.*`` address, ``[::1]``) or a
   host the server was started for (``--host``). A page of another site that a
   DNS record points at 127.0.0.1 (DNS rebinding) sends its own name, and is
   refused.
2. **Token.** The URL the command prints carries ``?token=``; the server answers
   it with a redirect to the same page without it, setting an HttpOnly,
   SameSite=Strict cookie (Jupyter's model). Every other request needs that
   cookie; without it the answer is a 403 page saying how to get in. The static
   files (the public libraries and the CSS) need neither.
3. **Writes.** A request that could change something (any method but GET and
   HEAD) must come from the page itself (``Origin``, else ``Referer``, of this
   server's own origin) and is refused in ``--read-only`` mode: the place where
   the forms of the next release check their CSRF token.

Every answer carries headers that keep it in its tab: a Content-Security-Policy
allowing only this server's own scripts and styles, no framing, no referrer,
no caching, and no CORS header at all.
"""

from __future__ import annotations

import hmac
import ipaddress
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Paths that need no cookie: the vendored browser files.
PUBLIC = "/-/static/"

_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
_NO_STORE = (b"cache-control", b"no-store")

type Refusal = Callable[[Request, int, str, str, str], Response]


def loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, IPv6 with or without brackets) is this machine."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port: ``[::1]:8000`` -> ``::1``."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """The ASGI middleware that checks the Host, the token or cookie, and writes.

    Args:
        app: The application behind it.
        token: The secret of the printed URL.
        cookie: The cookie's name (it names the port: browsers share cookies
            between the ports of one host).
        hosts: Host names allowed besides the loopback ones.
        read_only: Refuse every request that could change something.
        refuse: Renders an error page (request, status, title, message, advice).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        cookie: str,
        hosts: frozenset[str],
        read_only: bool,
        refuse: Refusal,
    ) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie
        self.hosts = frozenset(h.strip("[]").lower() for h in hosts)
        self.read_only = read_only
        self.refuse = refuse
        # What the cookie holds: derived from the token, so that it is never the token.
        self.session = hmac.new(
            token.encode(), b"effectful-durable ui session", "sha256"
        ).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response = self._check(request)
        public = scope["path"].startswith(PUBLIC)
        send = _with_headers(send, no_store=not public)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, request: Request) -> Response | None:
        """The refusal (or the token's redirect) for ``request``, or None to let it in."""
        host = request.headers.get("host", "")
        name = host_name(host)
        if not name or not (loopback(name) or name.lower() in self.hosts):
            return self.refuse(
                request,
                403,
                "This host name is not allowed",
                f"The page was asked for as {host!r}, which is not this machine's "
                "loopback address nor a host the server was started for.",
                "Open the address that `effectful-durable ui` printed. To reach the page "
                "under another name, start it with --host NAME.",
            )
        if request.url.path.startswith(PUBLIC):
            return None
        offered = request.query_params.get("token")
        if offered is not None:
            if not hmac.compare_digest(offered.encode(), self.token.encode()):
                return self._no_entry(request, "The token in this address is not this server's.")
            return self._enter(request)
        held = request.cookies.get(self.cookie, "")
        if not hmac.compare_digest(held.encode(), self.session.encode()):
            return self._no_entry(request, "This browser has not been let in yet.")
        if request.method not in ("GET", "HEAD"):
            return self._check_write(request)
        return None

    def _enter(self, request: Request) -> Response:
        """The token's answer: the same page without it, and the session cookie."""
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        path = "/" + request.url.path.lstrip("/")  # never //host: a redirect off the site
        target = URL(path=path, query=urllib.parse.urlencode(query))
        response = RedirectResponse(str(target), status_code=303)
        response.set_cookie(self.cookie, self.session, httponly=True, samesite="strict", path="/")
        return response

    def _no_entry(self, request: Request, why: str) -> Response:
        return self.refuse(
            request,
            403,
            "Open the page through its address",
            f"{why} The page shows your agents' conversations, so it lets in only a "
            "browser that opened the address `effectful-durable ui` printed when it "
            "started (it ends with ?token=...).",
            "Copy that address from the terminal where the command runs; a new run "
            "prints a new one.",
        )

    def _check_write(self, request: Request) -> Response | None:
        origin = request.headers.get("origin") or request.headers.get("referer") or ""
        parts = urllib.parse.urlsplit(origin)
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if f"{parts.scheme}://{parts.netloc}" != own:
            return self.refuse(
                request,
                403,
                "Refused: not sent by this page",
                f"A request to change something came from {origin or 'an unknown page'!r}, "
                "not from this page.",
                "Changes are made only from the page's own forms.",
            )
        if self.read_only:
            return self.refuse(
                request,
                403,
                "Read-only",
                "The page was started with --read-only: it changes nothing.",
                "Use the command line, or start the page without --read-only.",
            )
        return None


def _with_headers(send: Send, *, no_store: bool) -> Send:
    """``send``, adding the security headers to the response's start."""
    extra = [*_HEADERS, _NO_STORE] if no_store else list(_HEADERS)

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers: list[Any] = [
                (k, v)
                for k, v in message.get("headers", [])
                if not k.lower().startswith(b"access-control-")
            ]
            present = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in extra if k not in present]
            message = {**message, "headers": headers}
        await send(message)

    return sending
