"""The catalog: personas with their hot/cold state, and frame-0 thumbnails."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from hotplate.serve.catalog import list_catalog, thumbnail
from hotplate.serve.deps import Caller, Svc
from hotplate.serve.problems import public_text

router = APIRouter(tags=["catalog"])


@router.get("/v1/personas")
def personas(svc: Svc, caller: Caller) -> dict:
    """Every persona, attire and motion, hot or cold (and why), size, thumbnail URL."""
    s = svc.config.settings
    rows = list_catalog(svc.store, s.personas, s.recipe)
    for row in rows:  # "cannot read the source: <OSError naming a server path>"
        if row.get("why"):
            row["why"] = public_text(row["why"])
    return {"personas": rows}


@router.get("/v1/personas/{persona}/{attire}/thumbnail.jpg")
def persona_thumbnail(
    svc: Svc, caller: Caller, persona: str, attire: str, motion: str | None = None
):
    """Frame 0 of the hot avatar, read from the store."""
    s = svc.config.settings
    jpeg = thumbnail(svc.store, s.personas, s.recipe, persona, attire, motion)
    return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "max-age=60"})
