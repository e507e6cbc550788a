"""The web console's files, answered to HTTP API (payload 2.0) events: `GET /` and
`GET /console/{file+}`.

The files themselves are the console function's own code (`functions/console/static/`), not this
layer's: the layer only knows how to answer for a folder of them. Every answer, a 404 included,
carries the same security headers: a Content-Security-Policy that allows code, styles and images
from the console's own origin only (no inline script or style), and network calls to that origin
(the `/v1` API) and to the payload bucket (the presigned `body_url` of a result too big for a
page). The console has no power of its own: it is static files calling the public API with the
key the user typed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from freeinference_batch.store import objects

INDEX_FILE = "index.html"
FILES_PREFIX = "/console/"
# Text files only: the answers go out as plain (not base64) bodies.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def content_security_policy(payload_origin: str | None) -> str:
    """No inline script or style, nothing from another origin but the payload bucket's answers."""
    connect = "'self'" + (f" {payload_origin}" if payload_origin else "")
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        f"connect-src {connect}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def payload_origin(bucket: str) -> str:
    """The origin (scheme://host[:port]) of the bucket's presigned URLs, as the API signs them.

    Signed here with the same client the API signs `body_url` with (no call is made), so the CSP
    names the host those URLs really have: virtual-hosted on AWS, the moto server locally."""
    url = objects.presigned_get_url(bucket, "console", 60)
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


class ConsoleSite:
    """The console's files, read once (a cold start) from `root`; only those files are served,
    so no path a request names can reach anything else."""

    def __init__(self, root: Path, payload_origin: str | None) -> None:
        self.headers = {
            "Content-Security-Policy": content_security_policy(payload_origin),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
            "Cross-Origin-Opener-Policy": "same-origin",
        }
        self.files: dict[str, StaticFile] = {}
        for path in sorted(root.iterdir()):
            content_type = CONTENT_TYPES.get(path.suffix)
            if path.is_file() and content_type:
                body = path.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                self.files[path.name] = StaticFile(body, content_type, etag)

    def answer(self, event: dict[str, Any]) -> dict[str, Any]:
        path = event.get("rawPath") or "/"
        name = INDEX_FILE if path == "/" else path.removeprefix(FILES_PREFIX) if path.startswith(FILES_PREFIX) else ""
        found = self.files.get(name)
        if found is None:
            return self._answer(404, "text/plain; charset=utf-8", b"Not found\n")
        # Revalidated every time (the files change with a deploy), answered 304 when unchanged.
        headers = {"ETag": found.etag, "Cache-Control": "no-cache"}
        if (event.get("headers") or {}).get("if-none-match") == found.etag:
            return self._answer(304, found.content_type, b"", headers)
        return self._answer(200, found.content_type, found.body, headers)

    def _answer(self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> dict:
        return {
            "statusCode": status,
            "headers": {**self.headers, "Content-Type": content_type, **(extra or {})},
            "body": body.decode("utf-8"),
            "isBase64Encoded": False,
        }
