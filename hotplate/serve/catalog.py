"""The gallery's data: every source with its state in the store, and frame-0 thumbnails
read from the store (a cold avatar has none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from hotplate.serve.problems import Problem

THUMB_HEIGHT = 320


def list_catalog(store: Any, personas: Path, recipe: Any) -> list[dict[str, Any]]:
    """One row per source, as `hotplate ls` shows them."""
    from pipeline.catalog import iter_sources, plan_for, recipe_for

    rows = []
    for src in iter_sources(personas):
        if src.kind == "speech":  # talking footage for the mouth bank, not an attire
            continue
        row = {
            "persona": src.persona,
            "attire": src.attire,
            "motion": src.motion,
            "kind": src.kind,
            "file": src.path.name,
            "state": "cold",
            "why": None,
            "size": 0,
            "thumbnail": None,
        }
        try:
            planned = plan_for(store, src.path, recipe_for(personas, src.persona, recipe))
        except (OSError, ValueError) as exc:
            row["why"] = f"cannot read the source: {exc}"
            rows.append(row)
            continue
        size = store.avatar_bytes(planned.avatar)  # one snapshot: a gc meanwhile reads cold
        if size is None:
            row["why"] = "not precompiled under the current recipe (new or changed file)"
        else:
            row["state"], row["size"] = "hot", size
            row["thumbnail"] = thumbnail_url(src.persona, src.attire, src.motion)
        rows.append(row)
    return rows


def thumbnail_url(persona: str, attire: str, motion: str) -> str:
    return (
        f"/v1/personas/{quote(persona, safe='')}/{quote(attire, safe='')}/thumbnail.jpg"
        f"?motion={quote(motion, safe='')}"
    )


def thumbnail(
    store: Any, personas: Path, recipe: Any, persona: str, attire: str, motion: str | None
) -> bytes:
    """Frame 0 of the hot avatar, as a JPEG THUMB_HEIGHT pixels high."""
    import cv2
    import numpy as np

    from pipeline.catalog import plan_for, recipe_for
    from pipeline.frames import frame_name
    from pipeline.media import decode_frame
    from pipeline.personas import PersonaError, resolve

    try:
        found = resolve(personas, persona, attire, motion)
    except PersonaError as exc:
        raise Problem(404, str(exc)) from None
    planned = plan_for(store, found.path, recipe_for(personas, found.persona, recipe))
    data = None
    with store.read() as r:  # one snapshot: a gc meanwhile reads as cold, never half
        avatar = r.get("avatar", planned.avatar)
        frames = r.stage(avatar["stages"]["decode"]) if avatar is not None else None
        if frames is not None:
            data = np.asarray(r.array(frames.blobs[frame_name(0)])).copy()
    if data is None:
        raise Problem(
            404,
            f"{persona}/{attire} ({found.motion}) is cold, so the store has no frames of it; "
            "POST /v1/precompile to make it hot",
        )
    image = cv2.cvtColor(decode_frame(data), cv2.COLOR_RGB2BGR)
    scale = THUMB_HEIGHT / image.shape[0]
    if scale < 1:
        image = cv2.resize(
            image, (round(image.shape[1] * scale), THUMB_HEIGHT), interpolation=cv2.INTER_AREA
        )
    _, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 85])
    return jpeg.tobytes()
