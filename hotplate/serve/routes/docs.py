"""/docs: Swagger UI from the assets fastapi-standalone-docs ships (no CDN, works offline)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter()


def assets() -> Path:
    import fastapi_standalone_docs

    return Path(fastapi_standalone_docs.__file__).parent / "static"


@router.get("/docs", include_in_schema=False)
def docs() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="hotplate API",
        swagger_js_url="/docs/swagger/swagger-ui-bundle.js",
        swagger_css_url="/docs/swagger/swagger-ui.css",
        swagger_favicon_url="/docs/fastapi/favicon.png",
        oauth2_redirect_url=None,
        # validatorUrl null: Swagger UI would otherwise load a badge from its own host
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
    )


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/docs/swagger", StaticFiles(directory=assets() / "swagger"), name="docs-swagger")
    app.mount("/docs/fastapi", StaticFiles(directory=assets() / "fastapi"), name="docs-fastapi")
