"""A person's way into the status page when proxy keys are on (``CTXPROXY_API_KEYS``).

A browser cannot send ``Authorization: Bearer KEY`` by itself, so with keys on ``GET /`` was a 401
in JSON. :class:`StatusLogin` (pure ASGI middleware, outside :class:`app.api.auth.ProxyKeyMiddleware`)
adds a small login:

* ``GET /`` (or ``/status.json``) from a browser (``Accept: text/html``) with no key and no session:
  the login page (401, HTML): one field for a proxy key.
* ``POST /login`` (``key=...``, form-encoded, at most 4 KiB): a key that matches one of the proxy
  keys (:func:`app.api.auth.key_matches`: constant time, every key compared) starts a session
  and sets its cookie, then redirects (303) to the status page; a wrong key gets the login page
  again (401), no cookie. Failed logins are limited per client address (:class:`LoginLimiter`:
  a sliding window, ``MAX_FAILURES`` in ``FAILURE_WINDOW_S``, then 429 with ``Retry-After`` on
  the login page, the right key included, until the oldest failure leaves the window; at most
  ``MAX_ADDRESSES`` addresses tracked, per process). The address is the ASGI client's (uvicorn
  takes it from ``X-Forwarded-For`` only behind the proxies it trusts, ``--forwarded-allow-ips``).
* ``GET /logout`` or ``POST /logout``: the session ends on the server side (``app.service.
  sessions``: every copy of the cookie stops working at once, in every worker and every replica
  that shares the cache backend) and the cookie is cleared, back to the login page. The status
  page links to it (its "Sign out") when it was opened with a session (``SESSION_SCOPE_KEY``).

The session grants the read-only pages only (:data:`SESSION_PATHS`: ``GET``/``HEAD`` of ``/``,
``/status.json`` and ``/metrics``), never an API call: the cookie is looked at for those paths
only, and :func:`session_granted` (the hook in ``ProxyKeyMiddleware``) checks method and path
again. The cookie (``HttpOnly``, ``SameSite=Strict``, ``Path=/``, 12 hours; ``Secure`` when the
page is served over https: the scope's scheme, or ``X-Forwarded-Proto: https`` / ``Forwarded:
proto=https`` from a proxy in front) is not the key: ``v2.<expires_s>.<session id>.<HMAC-SHA256>``,
keyed by a secret derived from all the proxy keys, so every worker of ``ctxproxy serve --workers
N`` and every replica with the same keys checks it alike, and changing the keys ends every
session. Its MAC is compared in constant time; a cookie that passes opens a page only while its
session is live (``Sessions.live``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..observability.context import SESSION_SCOPE_KEY
from ..service.sessions import Sessions
from .auth import key_matches, presented_key

COOKIE = "ctxproxy_status"
SESSION_S = 12 * 3600
SESSION_PATHS: frozenset[str] = frozenset({"/", "/status.json", "/metrics"})
LOGIN_PATHS: frozenset[str] = frozenset({"/login", "/logout"})
MAX_FORM_BYTES = 4096
MAX_FAILURES = 5
FAILURE_WINDOW_S = 60.0
MAX_ADDRESSES = 4096
_VERSION = "v2"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


def session_granted(scope: Scope) -> bool:
    """True when :class:`StatusLogin` found a valid session cookie on a read-only page request
    (the hook ``ProxyKeyMiddleware`` asks; it can never open an API route)."""
    return (
        scope.get(SESSION_SCOPE_KEY) is True
        and scope.get("method") in ("GET", "HEAD")
        and scope.get("path") in SESSION_PATHS
    )


def session_secret(keys: Sequence[str]) -> bytes:
    """The MAC key of the session cookie: a function of the set of proxy keys only (so workers and
    replicas agree), never one of them."""
    material = b"\0".join(sorted(key.encode("utf-8") for key in keys))
    return hashlib.sha256(b"ctxproxy status session " + _VERSION.encode() + b"\0" + material).digest()


def _mac(secret: bytes, expires_s: int, session_id: str) -> str:
    return hmac.new(secret, f"{_VERSION}.{expires_s}.{session_id}".encode(), hashlib.sha256).hexdigest()


def new_session_id() -> str:
    """A session id: 32 random bytes, URL-safe base64 (no dot, so the cookie splits cleanly)."""
    return secrets.token_urlsafe(32)


def cookie_value(secret: bytes, *, now_s: float, session_id: str) -> str:
    """The cookie of session ``session_id``, signed, expiring ``SESSION_S`` after ``now_s``."""
    expires_s = int(now_s) + SESSION_S
    return f"{_VERSION}.{expires_s}.{session_id}.{_mac(secret, expires_s, session_id)}"


def cookie_session(secret: bytes, value: str | None, *, now_s: float) -> tuple[str, int] | None:
    """``(session id, expires_s)`` of a cookie :func:`cookie_value` made with ``secret`` that has
    not expired; None for anything else. Whether the session is still live is ``Sessions``'."""
    if not value:
        return None
    version, _, rest = value.partition(".")
    expires_text, _, rest = rest.partition(".")
    session_id, _, mac = rest.partition(".")
    if version != _VERSION or not expires_text.isdigit() or len(expires_text) > 12 or not session_id:
        return None
    expires_s = int(expires_text)
    if expires_s <= now_s:
        return None
    if not hmac.compare_digest(mac.encode(), _mac(secret, expires_s, session_id).encode()):
        return None
    return session_id, expires_s


class LoginLimiter:
    """Failed logins per client address in a sliding window (see the module docstring); bounded:
    at most ``max_addresses`` addresses, the one failed least recently dropped first."""

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        window_s: float = FAILURE_WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self.clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        horizon = self.clock() - self.window_s
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def retry_after_s(self, address: str) -> int | None:
        """Whole seconds until ``address`` may try again, or None when it may now."""
        times = self._recent(address)
        if times is None or len(times) < self.max_failures:
            return None
        return max(1, math.ceil(times[-self.max_failures] + self.window_s - self.clock()))

    def failed(self, address: str) -> None:
        times = self._recent(address)
        if times is None:
            times = self._failures[address] = deque(maxlen=self.max_failures)
        times.append(self.clock())
        self._failures.move_to_end(address)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

    def __len__(self) -> int:
        return len(self._failures)


def _address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def served_over_https(scope: Scope) -> bool:
    """The page is served over https: directly (the scope's scheme), or behind a proxy that says
    so (``X-Forwarded-Proto: https``, ``Forwarded: ...;proto=https``; the first hop's word)."""
    if scope.get("scheme") == "https":
        return True
    forwarded_proto = _header(scope, b"x-forwarded-proto").decode("latin-1")
    if forwarded_proto.split(",")[0].strip().lower() == "https":
        return True
    forwarded = _header(scope, b"forwarded").decode("latin-1").split(",")[0]
    for pair in forwarded.split(";"):
        name, _, value = pair.strip().partition("=")
        if name.strip().lower() == "proto" and value.strip().strip('"').lower() == "https":
            return True
    return False


def _cookie_of(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:  # a malformed Cookie header is no session
                return None
            morsel = jar.get(COOKIE)
            if morsel is not None:
                return morsel.value
    return None


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return b""


def _wants_html(scope: Scope) -> bool:
    return b"text/html" in _header(scope, b"accept")


def login_page(*, failed: bool = False, retry_after_s: int | None = None) -> str:
    """The login form (relative action, so it works behind a path prefix); ``retry_after_s``:
    too many failed logins from this address, the seconds until the next try."""
    notice = '<p class="bad" role="alert">That is not one of this proxy\'s keys.</p>' if failed else ""
    if retry_after_s is not None:
        notice = (
            '<p class="bad" role="alert">Too many failed sign-ins from your address: try again in '
            f"{retry_after_s} seconds.</p>"
        )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>ctxproxy status: sign in</title>
<style>
body {{ margin:0; font:15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color:#1d2330; background:#f6f8fb; }}
header {{ padding:14px 24px; background:#1d2330; color:#fff; }}
header h1 {{ margin:0; font-size:20px; }}
main {{ max-width:420px; margin:48px auto; background:#fff; border:1px solid #dde2ea;
        border-radius:8px; padding:20px 24px; }}
label {{ display:block; font-weight:600; margin-bottom:6px; }}
input[type=password] {{ width:100%; box-sizing:border-box; padding:8px; font:inherit;
                        border:1px solid #b8c0cc; border-radius:6px; }}
button {{ margin-top:12px; padding:8px 16px; font:inherit; border:0; border-radius:6px;
          background:#2f6fdb; color:#fff; cursor:pointer; }}
.bad {{ color:#c2410c; font-weight:600; }}
.muted {{ color:#5b6475; font-size:13px; }}
</style>
</head>
<body>
<header><h1>ctxproxy</h1></header>
<main>
{notice}
<form method="post" action="login">
  <label for="key">Proxy key</label>
  <input id="key" name="key" type="password" autocomplete="current-password" required autofocus>
  <button type="submit">Open the status page</button>
</form>
<p class="muted">One of the keys in CTXPROXY_API_KEYS. The session opens the read-only pages
(status, metrics) for {SESSION_S // 3600} hours; it never authorizes an API call.</p>
</main>
</body>
</html>
"""


def _page(
    status: int, body: str, *, set_cookie: str | None = None, retry_after_s: int | None = None
) -> Response:
    headers = {
        "Cache-Control": "no-store",
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    response = Response(body, status_code=status, media_type="text/html; charset=utf-8", headers=headers)
    if set_cookie is not None:
        response.headers.append("Set-Cookie", set_cookie)
    return response


def _redirect(location: str, *, set_cookie: str) -> Response:
    response = Response(status_code=303, headers={"Location": location, "Cache-Control": "no-store"})
    response.headers.append("Set-Cookie", set_cookie)
    return response


async def _read_form(receive: Receive) -> dict[str, list[str]] | None:
    """The form body, or None when it is over ``MAX_FORM_BYTES`` (a key is short)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    try:
        return parse_qs(b"".join(chunks).decode("utf-8"), max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        return None


class StatusLogin:
    """The login, the logout and the session check (see the module docstring); does nothing when
    ``keys`` is empty. ``sessions``: which sessions are live (the app shares one across workers
    and replicas); ``limiter``: the failed logins of each address."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Sequence[str],
        sessions: Sessions | None = None,
        limiter: LoginLimiter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.keys = tuple(key.encode("utf-8") for key in keys)
        self.secret = session_secret(keys)
        self.sessions = sessions if sessions is not None else Sessions(clock=clock)
        self.limiter = limiter if limiter is not None else LoginLimiter()
        self.clock = clock

    def _cookie(self, scope: Scope, value: str, *, max_age_s: int) -> str:
        secure = "; Secure" if served_over_https(scope) else ""
        return f"{COOKIE}={value}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Strict{secure}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys:
            await self.app(scope, receive, send)
            return
        path, method = scope.get("path"), scope.get("method")
        if path == "/login" and method == "POST":
            await self._login(scope, receive, send)
            return
        if path == "/logout" and method in ("GET", "POST"):
            found = cookie_session(self.secret, _cookie_of(scope), now_s=self.clock())
            if found is not None:
                await self.sessions.end(found[0], expires_s=found[1])
            cleared = self._cookie(scope, "", max_age_s=0)
            await _redirect("./", set_cookie=cleared)(scope, receive, send)
            return
        if path == "/login" and method == "GET":
            await _page(200, login_page())(scope, receive, send)
            return
        if path in SESSION_PATHS and method in ("GET", "HEAD"):
            found = cookie_session(self.secret, _cookie_of(scope), now_s=self.clock())
            if found is not None and await self.sessions.live(found[0]):
                scope = {**scope, SESSION_SCOPE_KEY: True}
            elif (
                method == "GET"
                and path != "/metrics"
                and _wants_html(scope)
                and not key_matches(presented_key(scope.get("headers", [])), self.keys)
            ):
                # A person at a browser: the form, where a JSON 401 would be a dead end.
                await _page(401, login_page())(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        address = _address(scope)
        wait_s = self.limiter.retry_after_s(address)
        if wait_s is not None:
            page = login_page(retry_after_s=wait_s)
            await _page(429, page, retry_after_s=wait_s)(scope, receive, send)
            return
        form = await _read_form(receive)
        key = (form or {}).get("key", [""])[0].strip()
        if not key_matches(key.encode("utf-8") if key else None, self.keys):
            self.limiter.failed(address)
            await _page(401, login_page(failed=True))(scope, receive, send)
            return
        self.limiter.succeeded(address)
        session_id = new_session_id()
        now_s = self.clock()
        await self.sessions.start(session_id, expires_s=int(now_s) + SESSION_S)
        value = cookie_value(self.secret, now_s=now_s, session_id=session_id)
        session = self._cookie(scope, value, max_age_s=SESSION_S)
        await _redirect("./", set_cookie=session)(scope, receive, send)


__all__ = [
    "COOKIE",
    "FAILURE_WINDOW_S",
    "MAX_FAILURES",
    "SESSION_PATHS",
    "SESSION_S",
    "LoginLimiter",
    "StatusLogin",
    "cookie_session",
    "cookie_value",
    "login_page",
    "new_session_id",
    "served_over_https",
    "session_granted",
    "session_secret",
]
