"""The playground: a page in the browser that tries every task the server serves (``GET
/playground``), linked from ``GET /``. Its files are static and ship inside omni-core (``static/``,
package data); the page reads ``/v1/models`` and ``/v1/audio/voices`` and calls the API like any
client, with the key the user enters. The page and its files (``PATHS``) are open without the key
(``serve/auth.py``): they hold no data, and every API call the page makes carries the key.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from omni_core.serve.errors import APIError

router = APIRouter()
STATIC = Path(__file__).parent / "static"
PAGE = "playground.html"
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # module scripts need a JavaScript type
    ".css": "text/css; charset=utf-8",
}
# Everything comes from this server: no CDN (the machine may be offline), nothing inline.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; media-src 'self' blob:; connect-src 'self'; object-src 'none'"
)
# Served by name from this table only: no path from the request ever reaches the file system.
ASSETS = {path.name: path for path in STATIC.iterdir() if path.suffix in (".js", ".css")}
# Every path this router answers, each by its exact name (and /playground/, which the app redirects
# to /playground): a path under /playground/ that names no file stays behind the key, as any
# unknown path does.
PATHS = frozenset({"/", "/playground", "/playground/", *(f"/playground/{name}" for name in ASSETS)})


def _file(path: Path) -> FileResponse:
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if path.suffix == ".html":
        headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=headers)


@router.get("/", include_in_schema=False)
async def index():
    return _file(STATIC / "index.html")


@router.get("/playground", include_in_schema=False)
async def playground():
    return _file(STATIC / PAGE)


@router.get("/playground/{name}", include_in_schema=False)
async def asset(name: str):
    path = ASSETS.get(name)
    if path is None:
        raise APIError(404, f"the playground has no file {name!r}", type="not_found_error", code="not_found")
    return _file(path)
