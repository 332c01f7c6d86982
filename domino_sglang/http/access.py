"""Who may call the server: admin routes, browser origins, Host names, the websocket key.

Installed by the plugin into a guarded server (flags.py guards_apply: DOMINO, `domino-sglang
serve`, or `--domino-guards on`), because SGLang 0.5.23's own defaults let one request take a
server down or act as its admin:
- routes SGLang marks "admin optional" (`/update_weights_*`, `/flush_cache`, `/abort_request`
  with `abort_all`, `/start_profile`, `/slow_down`, `/release_memory_occupation`, ...) accept the
  ordinary `--api-key`, and any caller at all on a keyless server. Here every admin route (SGLang's
  ADMIN_OPTIONAL and ADMIN_FORCE levels) needs `--admin-api-key`, and is refused (403) when the
  server has none;
- CORS reflects any Origin with credentials and the Host header is not checked, so any web page
  in a local browser can drive a server bound to 127.0.0.1 (cross-site requests, DNS rebinding).
  Here a request carrying an Origin is served only when that origin is allowed
  (`--domino-allowed-origins`) or is the server itself, and a loopback-bound server answers only
  loopback Host names (more with `--domino-allowed-hosts`);
- the websocket `/v1/realtime` skips SGLang's key check (its middleware sees HTTP only). Here it
  needs the ordinary key like every other API route, as `Authorization: Bearer KEY` or, from a
  browser, OpenAI's `openai-insecure-api-key.KEY` subprotocol.

`access_problem` is the pure decision (unit-tested); `AccessGuard` applies it (ASGI middleware).
Private SGLang internals (sglang_compat.py): `sglang.srt.utils.auth` (AuthLevel, the route's
level); and the CORS middleware SGLang adds to `http_server.app` at import.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
OPEN_PREFIXES = ("/health", "/ready", "/metrics")  # probes and scrapes, as SGLang keeps them
# Admin-marked routes kept at the ordinary key: SGLang calls /freeze_gc on itself after warm-up
# with the ordinary key when no admin key is set; it only freezes the collector's current objects.
ORDINARY_ADMIN_ROUTES = ("/freeze_gc",)


@dataclass(frozen=True)
class Refusal:
    status: int  # HTTP status; a websocket is closed with policy violation (1008) instead
    message: str


@dataclass(frozen=True)
class AccessRules:
    bind_host: str
    api_key: str | None = None
    admin_api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()

    @property
    def loopback(self) -> bool:
        return self.bind_host in LOOPBACK_NAMES or self.bind_host.startswith("127.")


def _hostname(host_header: str) -> str:
    """`host[:port]` or `[v6]:port` -> the name alone, lower-case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _bearer_is(authorization: str | None, key: str) -> bool:
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip(), key)


def _websocket_key(headers: dict[str, str]) -> str | None:
    """The key a websocket client offers: Bearer header, or OpenAI's browser subprotocol."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return token.strip()
    for proto in headers.get("sec-websocket-protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith("openai-insecure-api-key."):
            return proto.split(".", 1)[1]
    return None


def access_problem(rules: AccessRules, *, kind: str, path: str, headers: dict[str, str],
                   admin_route: bool) -> Refusal | None:
    """Why this request may not be served, or None. `headers`: lower-case names; `kind`:
    "http" or "websocket"; `admin_route`: SGLang marks the route admin (optional or force)."""
    host = headers.get("host", "")
    if rules.loopback and "*" not in rules.allowed_hosts:
        name = _hostname(host)
        if name not in LOOPBACK_NAMES and name not in rules.allowed_hosts:
            return Refusal(400, f"Host {host!r} is not served by this loopback-bound server "
                                "(allow it with --domino-allowed-hosts)")
    origin = headers.get("origin")
    if origin and origin != "null" and "*" not in rules.allowed_origins:
        same_origin = urlsplit(origin).netloc.lower() == host.strip().lower()
        if not same_origin and origin not in rules.allowed_origins:
            return Refusal(403, f"cross-origin request from {origin!r} refused (allow the "
                                "origin with --domino-allowed-origins)")
    elif origin == "null" and "*" not in rules.allowed_origins:
        return Refusal(403, "request from an opaque origin ('null') refused")
    if path.startswith(OPEN_PREFIXES):
        return None
    if admin_route and path not in ORDINARY_ADMIN_ROUTES:
        if not rules.admin_api_key:
            return Refusal(403, f"{path} is an admin route: start the server with "
                                "--admin-api-key to use it")
        if not _bearer_is(headers.get("authorization"), rules.admin_api_key):
            return Refusal(401, f"{path} is an admin route: it needs the admin key "
                                "(Authorization: Bearer ADMIN_KEY)")
        return None
    if kind == "websocket" and rules.api_key:
        offered = _websocket_key(headers)
        if offered is None or not secrets.compare_digest(offered, rules.api_key):
            return Refusal(401, "websocket needs the API key")
    return None


def is_admin_route(app, scope) -> bool:
    """SGLang marks the route ADMIN_OPTIONAL or ADMIN_FORCE (`@auth_level`)."""
    from domino_sglang.sglang_compat import AuthLevel, _get_auth_level_from_app_and_scope

    level = _get_auth_level_from_app_and_scope(app, scope)
    return level in (AuthLevel.ADMIN_OPTIONAL, AuthLevel.ADMIN_FORCE)


class AccessGuard:
    """ASGI middleware applying `access_problem` to every HTTP request and websocket."""

    def __init__(self, app, *, rules: AccessRules, fastapi_app):
        self.app = app
        self.rules = rules
        self.fastapi_app = fastapi_app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or (
                scope["type"] == "http" and scope["method"] == "OPTIONS"
                and self.rules.allowed_origins):  # a CORS preflight: CORSMiddleware answers
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        refusal = access_problem(self.rules, kind=scope["type"], path=scope["path"],
                                 headers=headers,
                                 admin_route=is_admin_route(self.fastapi_app, scope))
        if refusal is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.message})
            return
        from fastapi.responses import JSONResponse

        error = {"error": {"message": refusal.message, "code": refusal.status}}
        await JSONResponse(error, status_code=refusal.status)(scope, receive, send)


def install(app, server_args, options) -> None:
    """Replace SGLang's allow-every-origin CORS with `options.allowed_origins` (none by
    default) and add AccessGuard; call before the app starts."""
    from fastapi.middleware.cors import CORSMiddleware

    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not CORSMiddleware]
    if options.allowed_origins:
        wildcard = "*" in options.allowed_origins
        app.add_middleware(CORSMiddleware, allow_origins=list(options.allowed_origins),
                           allow_credentials=not wildcard, allow_methods=["*"],
                           allow_headers=["*"])
    rules = AccessRules(bind_host=str(server_args.host or ""), api_key=server_args.api_key,
                        admin_api_key=server_args.admin_api_key,
                        allowed_origins=options.allowed_origins,
                        allowed_hosts=tuple(h.lower() for h in options.allowed_hosts))
    app.add_middleware(AccessGuard, rules=rules, fastapi_app=app)
