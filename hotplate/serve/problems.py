"""RFC 9457 problem+json responses: every error the service returns, one line each.

No handler ever puts a traceback in a body: unexpected exceptions become a 500 whose
detail names only the exception type; the traceback goes to the server log.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("hotplate.serve")


class Problem(Exception):
    """An expected failure with its HTTP status and a one-line detail for the caller."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def problem_response(
    status: int, detail: str, instance: str = "", headers: dict[str, str] | None = None
) -> JSONResponse:
    title = HTTPStatus(status).phrase
    body = {
        "type": f"https://hotplate.dev/problems/{title.lower().replace(' ', '-')}",
        "title": title,
        "status": status,
        "detail": " ".join(detail.split()),
    }
    if instance:
        body["instance"] = instance
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def install(app: FastAPI) -> None:
    """Route every error through problem_response."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.detail, request.url.path, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return problem_response(exc.status_code, detail, request.url.path, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return problem_response(422, "; ".join(parts) or "invalid request", request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return problem_response(
            500,
            f"internal error ({type(exc).__name__}); the server log has the details",
            request.url.path,
        )
