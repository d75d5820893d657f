"""Signed URLs: for the requests a browser makes without headers (<video src>, a download
link, EventSource, a WebSocket), the page trades its bearer token for a URL bound to one
method, path and query."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from hotplate.serve.deps import Caller, policy_of
from hotplate.serve.guard import SIGNED_TTL_S, Policy
from hotplate.serve.problems import Problem

router = APIRouter(tags=["access"])


@router.get("/v1/sign")
def sign(
    caller: Caller,
    policy: Annotated[Policy, Depends(policy_of)],
    path: Annotated[
        str, Query(description="An API path (and query) to open, e.g. /v1/renders/ID/video.")
    ],
    method: Annotated[
        Literal["GET", "WEBSOCKET"], Query(description="GET (HEAD too) or WEBSOCKET.")
    ] = "GET",
) -> dict:
    """A URL that lets `method` of exactly `path` (its query too) through without a
    header, as you, for an hour. /v1/sign itself cannot be signed."""
    if not path.startswith("/v1/") or "#" in path:
        raise Problem(422, f"path {path[:80]!r} is not an API path; sign one like /v1/renders/ID")
    try:
        url = policy.sign(path, caller, method)
    except ValueError:
        raise Problem(
            422, f"{method} {path[:80]} cannot be signed: a signed URL never mints another"
        ) from None
    return {"url": url, "expires_in": SIGNED_TTL_S}
