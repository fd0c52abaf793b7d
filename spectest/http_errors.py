"""OpenAI-style error responses, and the middleware that guarantees every error has one.

Shared by spectest's two HTTP servers — the OpenAI-compatible one (``spectest.server``) and the
draft server (``spectest.remote.service``) — and so below both.

Owns: :class:`APIError` (status + OpenAI ``type``/``code``/``param``), the error body's model
(:class:`ErrorResponse`, for ``/openapi.json``), pydantic errors as 400s whose ``param`` is a
path like ``messages[0].content`` (:func:`validation_error`), ``error_response``, and
``error_middleware`` — which turns aiohttp's own HTTP errors (404 route, 405 method, 413 body
too large) and any exception a handler lets escape into the same JSON shape, so a client
never sees an HTML page or a dropped connection.

Does not know: the engine, the routes or metrics (a server passes a callback to count errors).
"""

from __future__ import annotations

import logging
from typing import Callable

from aiohttp import web
from pydantic import BaseModel, ValidationError

log = logging.getLogger("spectest.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_exceeded", 503: "service_unavailable"}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx answer (published in ``/openapi.json``)."""
    error: ErrorDetail


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> web.Response:
    return web.json_response(error_body(err.status, err.message, err.code, err.param),
                             status=err.status, headers=err.headers)


def param_path(loc: tuple, keep_last: bool = False) -> str | None:
    """A pydantic error location as the ``param`` clients read: ``messages[0].content``.

    Union-member tags, which ``schemas`` writes ``<...>``, are left out; with ``keep_last`` the
    last item is kept whatever it is (an unknown field's name may be any string, even one with a
    lone surrogate: it is written with a backslash escape then, as the client sent it)."""
    parts: list[str] = []
    for i, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        last = keep_last and i == len(loc) - 1
        if not last and (item == "__root__" or (item.startswith("<") and item.endswith(">"))):
            continue
        item = item.encode("utf-8", "backslashreplace").decode("utf-8")
        parts.append(f".{item}" if parts else item)
    return "".join(parts) or None


def validation_error(exc: ValidationError) -> APIError:
    first = exc.errors(include_url=False)[0]
    param = param_path(tuple(first.get("loc", ())), first.get("type") == "extra_forbidden")
    msg = first.get("msg", "invalid request")
    if first.get("type") == "string_unicode":  # pydantic's own check: a key, or a bounded str
        msg = ("text or a field name is not valid Unicode: it has a lone surrogate (JSON "
               "\\ud800-\\udfff escapes must come in high-low pairs)")
    if first.get("type") == "extra_forbidden":
        msg = f"unknown field {param!r}"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return APIError(400, f"{param + ': ' if param else ''}{msg}{more}", "invalid_request", param)


def error_middleware(count_error: Callable[[int], None]):
    @web.middleware
    async def middleware(request: web.Request, handler):
        try:
            return await handler(request)
        except APIError as err:
            count_error(err.status)
            return error_response(err)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            count_error(exc.status)
            return error_response(APIError(exc.status, exc.reason or "error",
                                           code=exc.reason.lower().replace(" ", "_")
                                           if exc.reason else None,
                                           headers={k: v for k, v in exc.headers.items()
                                                    if k.lower() == "allow"}))
        except (ConnectionResetError, ConnectionError):
            raise
        except Exception:  # a bug: log it, answer in the API's shape, keep serving
            log.exception("unhandled error on %s %s", request.method, request.path)
            count_error(500)
            return web.json_response(error_body(500, "internal server error", "internal_error"),
                                     status=500)

    return middleware
