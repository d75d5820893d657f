"""Signed URLs: for the GETs a browser makes without headers (<video src>, a download
link, EventSource), the page trades its bearer token for a URL bound to one path."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from hotplate.serve.deps import Caller, policy_of
from hotplate.serve.guard import SIGNED_TTL_S, Policy
from hotplate.serve.problems import Problem

router = APIRouter(tags=["access"])


@router.get("/v1/sign")
def sign(
    caller: Caller,
    policy: Annotated[Policy, Depends(policy_of)],
    path: Annotated[str, Query(description="An API path to GET, e.g. /v1/renders/ID/video.")],
) -> dict:
    """A URL that lets GET `path` through without a header, as you, for an hour."""
    if not path.startswith("/v1/") or "?" in path or "#" in path:
        raise Problem(422, f"path {path[:80]!r} is not an API path; sign one like /v1/renders/ID")
    return {"url": policy.sign(path, caller), "expires_in": SIGNED_TTL_S}
