"""FastAPI dependencies the routers share: the service, the token check, the render form.

The service is typed `Any` here: `Service` lives in app.py, which includes the routers,
and tests/test_layers.py forbids the import cycle a precise annotation would need.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, File, Form, Request, UploadFile

from hotplate.serve.config import ServeConfig
from hotplate.serve.problems import Problem


def service_of(request: Request) -> Any:
    """The app's `Service` (jobs, store, queue), made by the lifespan."""
    return request.app.state.service


def config_of(request: Request) -> ServeConfig:
    return request.app.state.config


def require_token(request: Request) -> None:
    token = config_of(request).token
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if not header or scheme.lower() != "bearer":
        raise Problem(
            401,
            "this server needs a token; send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(given.strip().encode(), token.encode()):
        raise Problem(403, "the bearer token is wrong; check HOTPLATE_TOKEN")


Svc = Annotated[Any, Depends(service_of)]
Config = Annotated[ServeConfig, Depends(config_of)]
Auth = Depends(require_token)


@dataclass
class RenderForm:
    persona: str
    audio: UploadFile
    attire: str
    motion: str | None
    backend: str | None


def render_form(
    persona: Annotated[str, Form(description="Persona folder name, e.g. ruby.")],
    audio: Annotated[UploadFile, File(description="WAV, MP3, M4A, FLAC or OGG.")],
    attire: Annotated[str, Form(description="Attire; the portrait when omitted.")] = "default",
    motion: Annotated[str | None, Form(description="Motion loop of the attire.")] = None,
    backend: Annotated[str | None, Form(description="warp or musetalk.")] = None,
) -> RenderForm:
    """The multipart fields of a render request (both render routes)."""
    return RenderForm(persona, audio, attire, motion, backend)
