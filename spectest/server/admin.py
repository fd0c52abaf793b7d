"""The admin endpoint of ``spectest serve``: speculation switched off/on, K and the K policy
changed at runtime (``GET`` / ``POST /admin/speculation``).

Owns: who may call it — loopback peers only by default (any other peer gets a 403, whatever
``--host`` the server binds), or, when the server has an admin key (``--admin-key``, separate
from ``--api-key``), anyone presenting ``Authorization: Bearer <admin key>`` (401 otherwise);
turning a validated :class:`~spectest.server.schemas.SpeculationUpdate` into a request to the
engine's :class:`~spectest.engine.control.SpeculationControl`; waiting briefly for the engine's
next round boundary so the answer can say when the change took effect (or ``at next round``);
and one INFO log line per change, old → new.

Does not know: how the engine applies a change, or Prometheus (the app subscribes its metrics
to the control's applied changes).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time

from aiohttp import web
from pydantic import ValidationError

from spectest.engine.control import (SettingError, SpeculationChange, SpeculationControl,
                                     SpeculationSettings)
from spectest.http_errors import APIError, validation_error
from spectest.server.schemas import SpeculationUpdate

log = logging.getLogger("spectest.server.admin")
PATH = "/admin/speculation"
WAIT_FOR_ROUND_S = 2.0  # how long a POST waits for the round boundary before answering


def is_loopback(peer: str | None) -> bool:
    """Whether a peer address (``request.remote``) is this host: 127.0.0.0/8, ::1, or either
    mapped into IPv6. Anything unparsable (a Unix socket, no peer) is not."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def check_access(peer: str | None, authorization: str, admin_key: str | None) -> None:
    """Raise the 401/403 :class:`APIError` an admin request from ``peer`` deserves, if any."""
    if admin_key:
        if not hmac.compare_digest(authorization.encode("utf-8", "surrogatepass"),
                                   f"Bearer {admin_key}".encode("utf-8", "surrogatepass")):
            raise APIError(401, "missing or invalid admin key (Authorization: Bearer <admin "
                           "key>; the API key does not open the admin endpoint)",
                           "invalid_admin_key")
    elif not is_loopback(peer):
        raise APIError(403, f"{PATH} answers loopback clients only; start the server with "
                       "--admin-key KEY to allow others", "admin_loopback_only")


def _settings(s: SpeculationSettings | None) -> dict | None:
    return None if s is None else {"enabled": s.enabled, "k": s.k, "k_policy": s.k_policy}


def _change(c: SpeculationChange | None) -> dict | None:
    if c is None:
        return None
    effective = ("unchanged" if c.applied_at is not None and not c.changed else
                 "applied" if c.applied_at is not None else "at next round")
    return {"old": _settings(c.old), "new": _settings(c.new), "requested_at": c.requested_at,
            "effective": effective, "effective_at": c.applied_at,
            "effective_after_s": c.effective_after_s, "round": c.round}


class Admin:
    """The two handlers over one control; ``drafter`` names the server's drafter."""

    def __init__(self, control: SpeculationControl, drafter: str, admin_key: str | None = None):
        self.control, self.drafter, self.admin_key = control, drafter, admin_key

    def routes(self) -> list[web.RouteDef]:
        return [web.get(PATH, self.get), web.post(PATH, self.post)]

    def state(self, change: SpeculationChange | None) -> dict:
        s, pending = self.control.settings(), self.control.pending()
        return {**_settings(s), "k_limit": self.control.k_limit, "drafter": self.drafter,
                "switches": self.control.switches,
                "pending": _settings(pending.new if pending else None),
                "change": _change(change)}

    def _access(self, request: web.Request) -> None:
        check_access(request.remote, request.headers.get("Authorization", ""), self.admin_key)

    async def get(self, request: web.Request) -> web.Response:
        self._access(request)
        return web.json_response(self.state(self.control.last()))

    async def post(self, request: web.Request) -> web.Response:
        self._access(request)
        body = await _parse(request)
        try:
            change = self.control.request(body.enabled, body.k, body.k_policy)
        except SettingError as exc:
            raise APIError(400, str(exc), "invalid_speculation_setting", exc.field) from None
        if change.applied_at is None:  # pending: the engine takes it at its next round boundary
            deadline = time.monotonic() + WAIT_FOR_ROUND_S
            while time.monotonic() < deadline:
                applied = self.control.change(change.version)
                if applied is not None:
                    change = applied
                    break
                await asyncio.sleep(0.005)
        when = (f"effective after {change.effective_after_s:.3f} s at round {change.round}"
                if change.applied_at is not None else "effective at the next round")
        if change.changed:
            log.info("speculation %s → %s (from %s; %s)", change.old.describe(),
                     change.new.describe(), request.remote, when)
        return web.json_response(self.state(change))


async def _parse(request: web.Request) -> SpeculationUpdate:
    try:
        data = json.loads(await request.read())
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, too many digits
        raise APIError(400, "request body is not valid JSON", "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", "invalid_json")
    try:
        return SpeculationUpdate.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
