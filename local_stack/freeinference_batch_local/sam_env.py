"""An env-vars file for `sam local` against the running local stack.

`sam local invoke` and `sam local start-api` run the functions in containers, with the
template's environment: `!Ref BatchTable` there is just the text "BatchTable". The local stack
writes `.local-stack/sam-env.json` (SAM's `--env-vars` format: `Parameters` for every function,
then per-function entries) holding the real table names, queue URLs and secret ARN it created,
and every URL on this machine's loopback (moto, the simulated upstream) rewritten to
`host.docker.internal`, which is how a container reaches the host. SAM overrides only the
variables the template declares, so the file covers each of them, `AWS_ENDPOINT_URL` included.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from freeinference_batch_local.cloudformation.resources import TemplateResources, env_string
from freeinference_batch_local.state import STATE_DIR

SAM_ENV_FILE = "sam-env.json"
DOCKER_HOST = "host.docker.internal"
# The key events/api-*.json carry: the local stack creates it, so those events work against it.
SAMPLE_EVENTS_KEY = "hyi-sample-key-0123456789abcdef0123456789abcdef"
SAMPLE_EVENTS_ACCOUNT = "sample"
_LOOPBACK = re.compile(r"//(?:127\.0\.0\.1|localhost|0\.0\.0\.0)(?=[:/]|$)")


def container_url(value: str, host: str = DOCKER_HOST) -> str:
    """`value` with every loopback URL in it pointed at `host` (URLs inside JSON text too)."""
    return _LOOPBACK.sub(f"//{host}", value)


def sam_env_vars(template: dict[str, Any], resources: TemplateResources, stack_env: dict[str, str],
                 host: str = DOCKER_HOST) -> dict[str, dict[str, str]]:
    """SAM's env-vars document: the stack's value of every global variable, and each function's
    own variables resolved against the stack's resources."""
    function_globals = (template.get("Globals") or {}).get("Function") or {}
    declared = (function_globals.get("Environment") or {}).get("Variables") or {}
    parameters = {
        name: container_url(stack_env[name] if name in stack_env else env_string(resources.resolve(value)), host)
        for name, value in declared.items()
    }
    document: dict[str, dict[str, str]] = {"Parameters": parameters}
    for logical_id, resource in (template.get("Resources") or {}).items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        own = ((resource.get("Properties") or {}).get("Environment") or {}).get("Variables") or {}
        # A nested stack's function (`Block/Function`, keyed by that full path, which SAM matches)
        # repeats the global variables in its own environment: those take the global value.
        own = {name: value for name, value in own.items() if name not in declared or value != declared[name]}
        if own:
            document[logical_id] = {
                name: container_url(env_string(resources.resolve(value)), host) for name, value in own.items()
            }
    return document


def sam_env_path(directory: str | Path) -> Path:
    return Path(directory) / STATE_DIR / SAM_ENV_FILE


def write_sam_env(document: dict[str, dict[str, str]], directory: str | Path) -> Path:
    path = sam_env_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
