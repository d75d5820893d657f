"""RFC 9457 problem+json responses: every error the service returns, one line each.

No handler ever puts a traceback or a server path in a body: details pass through
`public_text` (absolute paths become their last component); unexpected exceptions become
a 500 whose detail names only the exception type. Each body carries the request's id
(`request_id`, also the `X-Request-Id` header); the log line with the same id has the
full detail, and the traceback of a 500.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("hotplate.serve")
# An absolute POSIX path of two or more parts, not an API route (/v1/...):
# /srv/data/uploads/ab12.wav -> ab12.wav
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?!v1/)(?:[^\s'\"/:;,()\[\]]+/)+([^\s'\"/:;,()\[\]]*)")


class Problem(Exception):
    """An expected failure with its HTTP status and a one-line detail for the caller."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def public_text(text: str) -> str:
    """`text` as one line with no server paths in it (each becomes its file name)."""
    return ABSOLUTE_PATH.sub(lambda m: m.group(1) or "/", " ".join(text.split()))


def problem_body(status: int, detail: str, instance: str = "", request_id: str = "") -> dict:
    title = HTTPStatus(status).phrase
    body: dict[str, Any] = {
        "type": f"https://hotplate.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": public_text(detail),
    }
    if instance:
        body["instance"] = instance
    if request_id:
        body["request_id"] = request_id
    return body


def request_id_of(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id", "")


def problem_response(
    status: int,
    detail: str,
    instance: str = "",
    headers: dict[str, str] | None = None,
    request_id: str = "",
) -> JSONResponse:
    body = problem_body(status, detail, instance, request_id)
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _answer(request: Request, status: int, detail: str, headers: dict | None = None):
    rid = request_id_of(request)
    log.info("request %s %s %s -> %d: %s", rid, request.method, request.url.path, status, detail)
    return problem_response(status, detail, request.url.path, headers, rid)


def install(app: FastAPI) -> None:
    """Route every error through problem_response."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return _answer(request, exc.status, exc.detail, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return _answer(request, exc.status_code, detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return _answer(request, 422, "; ".join(parts) or "invalid request")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        refused = request.scope.get("hotplate.refused")
        if refused is None or not refused():  # not a body the guard already cut off
            log.exception(
                "request %s: unexpected error on %s", request_id_of(request), request.url.path
            )
        rid = request_id_of(request)
        return problem_response(  # sent from outside the guard: it adds the id header here
            500,
            f"internal error ({type(exc).__name__}); the server log has the details under "
            f"request id {rid or 'unknown'}",
            request.url.path,
            {"X-Request-Id": rid} if rid else None,
            rid,
        )
