"""The console function, driven by its sample event (as `sam local invoke` would): its files, their
headers, and nothing else."""

from __future__ import annotations

import copy
import json
from urllib.parse import urlsplit

from freeinference_batch.core import aws
from freeinference_batch_local.handlers import LambdaContext, load_handler, repo_root

STATIC = repo_root() / "functions" / "console" / "static"


def get(path: str, **headers: str) -> dict:
    event = json.loads((repo_root() / "events" / "console-get-index.json").read_text())
    event = copy.deepcopy(event)
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["headers"].update(headers)
    return load_handler("console")(event, LambdaContext("console", 256, 5))


def test_the_console_function_serves_its_files_with_their_security_headers(harness):
    index = get("/")
    assert index["statusCode"] == 200
    assert index["headers"]["Content-Type"] == "text/html; charset=utf-8"
    assert index["body"] == (STATIC / "index.html").read_text()
    script = get("/console/console.js")
    assert script["statusCode"] == 200 and script["headers"]["Content-Type"] == "text/javascript; charset=utf-8"
    # Every answer, a 404 too, forbids inline code and other origins; calls may reach the bucket
    # at the host its presigned URLs have (signed by the same client as the API's body_url)
    body_url = aws.s3().generate_presigned_url("get_object", Params={"Bucket": harness.settings.payload_bucket_name,
                                                                     "Key": "x"})
    bucket_origin = "{0.scheme}://{0.netloc}".format(urlsplit(body_url))
    for answer in (index, script, get("/console/missing.js")):
        policy = answer["headers"]["Content-Security-Policy"]
        assert "unsafe-inline" not in policy
        assert "script-src 'self'" in policy and "style-src 'self'" in policy and "img-src 'self'" in policy
        assert f"connect-src 'self' {bucket_origin};" in policy
        assert answer["headers"]["X-Content-Type-Options"] == "nosniff"


def test_only_the_static_files_are_served_and_unchanged_ones_are_not_sent_again(harness):
    # Nothing outside static/, whatever the path says (the function's own code included)
    for path in ("/console/../app.py", "/console/app.py", "/console/", "/console/%2e%2e/app.py", "/index.html",
                 "/v1/batches"):
        assert get(path)["statusCode"] == 404, path
    first = get("/console/console.css")
    assert first["headers"]["Cache-Control"] == "no-cache"
    again = get("/console/console.css", **{"if-none-match": first["headers"]["ETag"]})
    assert again["statusCode"] == 304 and again["body"] == ""
