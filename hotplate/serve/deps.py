"""FastAPI dependencies the routers share: the service, the caller, the render form.

The service is typed `Any` here: `Service` lives in app.py, which includes the routers,
and tests/test_layers.py forbids the import cycle a precise annotation would need.
Who the caller is was settled by the guard (guard.py) before the app saw the request;
`caller_of` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, File, Form, Request, UploadFile
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hotplate.serve.config import ServeConfig
from hotplate.serve.guard import ANONYMOUS, LOCAL, Client, Policy
from hotplate.serve.problems import Problem


def service_of(request: Request) -> Any:
    """The app's `Service` (jobs, store, queue), made by the lifespan."""
    return request.app.state.service


def config_of(request: Request) -> ServeConfig:
    return request.app.state.config


def policy_of(request: Request) -> Policy:
    return request.app.state.policy


# Only for the OpenAPI schema (the lock in /docs, "Authorize"): the guard checks tokens.
bearer = HTTPBearer(auto_error=False, description="A token from --token-file or HOTPLATE_TOKEN.")


def caller_of(
    request: Request,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
) -> Client:
    """The client the guard identified; 401 if there is none where a token is needed."""
    client = request.scope.get("state", {}).get("client")
    if client is None:
        client = ANONYMOUS if config_of(request).token_required else LOCAL
    if client is ANONYMOUS:
        raise Problem(
            401,
            "this server needs a token; send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": "Bearer"},
        )
    return client


def require_token(request: Request) -> None:
    caller_of(request)


Svc = Annotated[Any, Depends(service_of)]
Config = Annotated[ServeConfig, Depends(config_of)]
Caller = Annotated[Client, Depends(caller_of)]
Auth = Depends(require_token)


@dataclass
class RenderForm:
    persona: str
    audio: UploadFile
    attire: str
    motion: str | None
    backend: str | None
    profile: str | None = None


def check_profile(profile: str | None, default: str) -> str:
    """The encoder profile a request asked for (`default` when it named none); a 422
    Problem naming the choices for an unknown one."""
    from pipeline.render.profiles import PROFILES

    if profile is None or profile == "":
        return default
    if profile not in PROFILES:
        raise Problem(
            422, f"profile {profile!r} is not one of {', '.join(PROFILES)}; send one of them"
        )
    return profile


def render_form(
    persona: Annotated[str, Form(description="Persona folder name, e.g. ruby.")],
    audio: Annotated[UploadFile, File(description="WAV, MP3, M4A, FLAC or OGG.")],
    attire: Annotated[str, Form(description="Attire; the portrait when omitted.")] = "default",
    motion: Annotated[str | None, Form(description="Motion loop of the attire.")] = None,
    backend: Annotated[str | None, Form(description="warp or musetalk.")] = None,
    profile: Annotated[
        str | None,
        Form(
            description="Encoder profile: preview (fast) or export (the file's quality); "
            "preview for /v1/lip-sync/stream, export for /v1/lip-sync when omitted."
        ),
    ] = None,
) -> RenderForm:
    """The multipart fields of a render request (both render routes)."""
    return RenderForm(persona, audio, attire, motion, backend, profile)
