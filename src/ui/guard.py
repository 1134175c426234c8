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
   server's own origin), is refused in ``--read-only`` mode, and must be a form
   (``application/x-www-form-urlencoded``, at most :data:`MAX_FORM` bytes)
   carrying the form token of its session: an HMAC of the session id, which
   only the pages shown to that browser hold. A form of another session, or of
   an earlier run of the server, is refused; so is one without the token. The
   form's fields, checked, are handed to the route in the request's scope
   (:func:`form_of`); GET never changes anything.

Each browser that enters gets a session of its own: the cookie holds a random
session id and its HMAC under a key derived from the token, so a cookie of an
earlier run (another token) lets nobody in.

Every answer carries headers that keep it in its tab: a Content-Security-Policy
allowing only this server's own scripts and styles, no framing, no referrer sent
to another site, no caching, and no CORS header at all.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Paths that need no cookie: the vendored browser files.
PUBLIC = "/-/static/"
#: The most bytes a form may send: the library's own limits (64 KiB of arguments or
#: of an event's payload, as JSON) fit, so that it is the library that refuses them.
MAX_FORM = 512 * 1024
#: The form field that carries the form token.
TOKEN_FIELD = "csrf"

# What the guard leaves in a request's scope for the routes.
_SESSION = "effectful_durable.session"
_FORM_TOKEN = "effectful_durable.form_token"
_FORM = "effectful_durable.form"

_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # Not "no-referrer": a browser then sends "Origin: null" with the page's own forms
    # (fetch.spec.whatwg.org/#origin-header); no address leaves for another site.
    (b"referrer-policy", b"same-origin"),
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


def session_of(request: Request) -> str:
    """The session id of a request the guard let in ("" for a public file)."""
    return str(request.scope.get(_SESSION, ""))


def form_token_of(request: Request) -> str:
    """The form token of the request's session, for the forms its page holds."""
    return str(request.scope.get(_FORM_TOKEN, ""))


def form_of(request: Request) -> Mapping[str, str]:
    """The fields of a form the guard checked (each name's first value), without its token."""
    form: Mapping[str, str] = request.scope.get(_FORM, {})
    return form


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
        # The key of the sessions' signatures: derived from the token, never the token.
        self._key = hmac.new(token.encode(), b"effectful-durable ui key", "sha256").digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response = self._check(request)
        if response is None and _SESSION in scope and request.method not in ("GET", "HEAD"):
            response, receive = await self._check_form(request, receive)
        public = scope["path"].startswith(PUBLIC)
        send = _with_headers(send, no_store=not public)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _sign(self, purpose: str, session: str) -> str:
        return hmac.new(self._key, f"{purpose}:{session}".encode(), "sha256").hexdigest()

    def _session(self, cookie: str) -> str | None:
        """The session id the cookie holds, if this server signed it."""
        session, _, signature = cookie.partition(".")
        expected = self._sign("session", session)
        if not session or not hmac.compare_digest(signature.encode(), expected.encode()):
            return None
        return session

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
        session = self._session(request.cookies.get(self.cookie, ""))
        if session is None:
            return self._no_entry(request, "This browser has not been let in yet.")
        request.scope[_SESSION] = session
        request.scope[_FORM_TOKEN] = self._sign("form", session)
        if request.method not in ("GET", "HEAD"):
            return self._check_write(request)
        return None

    def _enter(self, request: Request) -> Response:
        """The token's answer: the same page without it, and the session cookie."""
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        path = "/" + request.url.path.lstrip("/")  # never //host: a redirect off the site
        target = URL(path=path, query=urllib.parse.urlencode(query))
        response = RedirectResponse(str(target), status_code=303)
        session = secrets.token_urlsafe(18)
        cookie = f"{session}.{self._sign('session', session)}"
        response.set_cookie(self.cookie, cookie, httponly=True, samesite="strict", path="/")
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

    async def _check_form(
        self, request: Request, receive: Receive
    ) -> tuple[Response | None, Receive]:
        """Read the form a write sends and check its token: a refusal, or None and a
        ``receive`` that hands the body on to the route."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            refused = self.refuse(
                request,
                415,
                "Refused: not a form of this page",
                f"A request to change something sent {kind or 'no content type'!r}, "
                "not one of this page's forms. Nothing was changed.",
                "Changes are made only from the page's own forms.",
            )
            return refused, receive
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_FORM:
                refused = self.refuse(
                    request,
                    413,
                    "Refused: the form is too large",
                    f"A form may send at most {MAX_FORM // 1024} KiB. Nothing was changed.",
                    "",
                )
                return refused, receive
            if not message.get("more_body", False):
                break
        try:
            fields = urllib.parse.parse_qsl(
                body.decode(), keep_blank_values=True, strict_parsing=False, max_num_fields=200
            )
        except ValueError as error:  # not UTF-8, or too many fields
            refused = self.refuse(
                request, 400, "Refused: a malformed form", f"{error}. Nothing was changed.", ""
            )
            return refused, receive
        form: dict[str, str] = {}
        for name, value in fields:
            form.setdefault(name, value)
        offered = form.pop(TOKEN_FIELD, "")
        expected = request.scope[_FORM_TOKEN]
        if not hmac.compare_digest(offered.encode(), expected.encode()):
            why = "carries no form token" if not offered else "carries a stale form token"
            refused = self.refuse(
                request,
                403,
                "Refused: this form is out of date",
                f"The form {why}: it was not made by this page for this browser, or it "
                "was made before the server restarted. Nothing was changed.",
                "Open the page again and do it from there.",
            )
            return refused, receive
        request.scope[_FORM] = form
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return None, replay


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
