"""A person's way into the status page when proxy keys are on (``CTXPROXY_API_KEYS``).

A browser cannot send ``Authorization: Bearer KEY`` by itself, so with keys on ``GET /`` was a 401
in JSON. :class:`StatusLogin` (pure ASGI middleware, outside :class:`app.api.auth.ProxyKeyMiddleware`)
adds a small login:

* ``GET /`` (or ``/status.json``) from a browser (``Accept: text/html``) with no key and no session:
  the login page (401, HTML): one field for a proxy key.
* ``POST /login`` (``key=...``, form-encoded, at most 4 KiB): a key that matches one of the proxy
  keys (:func:`app.api.auth.key_matches`: constant time, every key compared) sets the session
  cookie and redirects (303) to the status page; a wrong key gets the login page again (401), no
  cookie.
* ``GET /logout`` or ``POST /logout``: the cookie is cleared, back to the login page. The status
  page links to it (its "Sign out") when it was opened with a session (``SESSION_SCOPE_KEY``).

The session grants the read-only pages only (:data:`SESSION_PATHS`: ``GET``/``HEAD`` of ``/``,
``/status.json`` and ``/metrics``), never an API call: the cookie is looked at for those paths
only, and :func:`session_granted` (the hook in ``ProxyKeyMiddleware``) checks method and path
again. The cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` on https, ``Path=/``, 12 hours)
is not the key: ``v1.<expires_s>.<HMAC-SHA256>``, keyed by a secret derived from all the proxy keys,
so every worker of ``ctxproxy serve --workers N`` and every replica with the same keys checks it
alike, and changing the keys ends every session. Its MAC is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Sequence
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..observability.context import SESSION_SCOPE_KEY
from .auth import key_matches, presented_key

COOKIE = "ctxproxy_status"
SESSION_S = 12 * 3600
SESSION_PATHS: frozenset[str] = frozenset({"/", "/status.json", "/metrics"})
LOGIN_PATHS: frozenset[str] = frozenset({"/login", "/logout"})
MAX_FORM_BYTES = 4096
_VERSION = "v1"

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


def _mac(secret: bytes, expires_s: int) -> str:
    return hmac.new(secret, f"{_VERSION}.{expires_s}".encode(), hashlib.sha256).hexdigest()


def cookie_value(secret: bytes, *, now_s: float) -> str:
    """A session cookie value that expires ``SESSION_S`` after ``now_s``."""
    expires_s = int(now_s) + SESSION_S
    return f"{_VERSION}.{expires_s}.{_mac(secret, expires_s)}"


def cookie_valid(secret: bytes, value: str | None, *, now_s: float) -> bool:
    """``value`` was made by :func:`cookie_value` with ``secret`` and has not expired."""
    if not value:
        return False
    version, _, rest = value.partition(".")
    expires_text, _, mac = rest.partition(".")
    if version != _VERSION or not expires_text.isdigit() or len(expires_text) > 12:
        return False
    expires_s = int(expires_text)
    if expires_s <= now_s:
        return False
    return hmac.compare_digest(mac.encode(), _mac(secret, expires_s).encode())


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


def login_page(*, failed: bool = False) -> str:
    """The login form (relative action, so it works behind a path prefix)."""
    notice = '<p class="bad" role="alert">That is not one of this proxy\'s keys.</p>' if failed else ""
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


def _page(status: int, body: str, *, set_cookie: str | None = None) -> Response:
    headers = {
        "Cache-Control": "no-store",
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
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
    ``keys`` is empty."""

    def __init__(self, app: ASGIApp, *, keys: Sequence[str], clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.keys = tuple(key.encode("utf-8") for key in keys)
        self.secret = session_secret(keys)
        self.clock = clock

    def _cookie(self, scope: Scope, value: str, *, max_age_s: int) -> str:
        secure = "; Secure" if scope.get("scheme") == "https" else ""
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
            cleared = self._cookie(scope, "", max_age_s=0)
            await _redirect("./", set_cookie=cleared)(scope, receive, send)
            return
        if path == "/login" and method == "GET":
            await _page(200, login_page())(scope, receive, send)
            return
        if path in SESSION_PATHS and method in ("GET", "HEAD"):
            if cookie_valid(self.secret, _cookie_of(scope), now_s=self.clock()):
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
        form = await _read_form(receive)
        key = (form or {}).get("key", [""])[0].strip()
        if not key_matches(key.encode("utf-8") if key else None, self.keys):
            await _page(401, login_page(failed=True))(scope, receive, send)
            return
        session = self._cookie(scope, cookie_value(self.secret, now_s=self.clock()), max_age_s=SESSION_S)
        await _redirect("./", set_cookie=session)(scope, receive, send)


__all__ = [
    "COOKIE",
    "SESSION_PATHS",
    "SESSION_S",
    "StatusLogin",
    "cookie_valid",
    "cookie_value",
    "login_page",
    "session_granted",
    "session_secret",
]
