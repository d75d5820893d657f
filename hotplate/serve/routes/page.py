"""The editors' page at / and its static files (shipped in the package)."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

STATIC = files("hotplate.serve") / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
def page() -> HTMLResponse:
    return HTMLResponse((STATIC / "index.html").read_text())
