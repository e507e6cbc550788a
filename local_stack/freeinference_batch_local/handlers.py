"""Loading the functions' handlers in-process, and the Lambda context they are called with.

Every function's code is `functions/<name>/app.py`, so importing them as `app` would make the
api and the worker collide; each file is loaded by path under its own module name instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from freeinference_batch.core.pages import LAMBDA_PAYLOAD_LIMIT

from freeinference_batch_local.cloudformation.template import function_properties

REPO_ROOT_ENV = "FREEINFERENCE_REPO_ROOT"
LOCAL_REGION = "us-east-1"
LOCAL_ACCOUNT_ID = "123456789012"
LOCAL_STACK_NAME = "freeinference-batch-local"
# Lambda's synchronous invocation payload, request and response alike (6 MB in the quotas page;
# Lambda's own refusal says "Request must be smaller than 6291456 bytes"). API Gateway's events
# and the SQS event source mapping's events are synchronous invocations. The service bounds its
# answers by the same number (pages.py).
LAMBDA_INVOKE_PAYLOAD_BYTES = LAMBDA_PAYLOAD_LIMIT
# A function with no reserved concurrency scales on AWS up to the account's unreserved
# concurrency; locally each environment is a process of ~70 MB, so the stack runs at most this many
# at once and queues invocations beyond it (AWS would start more). 10 is the concurrency quota AWS
# gives a new account.
LOCAL_UNRESERVED_CONCURRENCY = 10

_modules: dict[Path, ModuleType] = {}
_modules_lock = threading.Lock()


def invoke_payload_bytes(payload: Any) -> int:
    """The size Lambda measures for an invoke payload: the JSON text of an event or of a result.

    Serialized as the Python runtime does (`json.dumps`, so ASCII-escaped, with its default
    separators): the larger of the plausible encodings, so that what passes here passes on AWS.
    """
    return len(json.dumps(payload, default=str).encode("utf-8"))


def repo_root() -> Path:
    """The repository: $FREEINFERENCE_REPO_ROOT, else where this package sits in it, else cwd."""
    configured = os.environ.get(REPO_ROOT_ENV)
    if configured:
        return Path(configured).resolve()
    # <repo>/local_stack/freeinference_batch_local/handlers.py
    candidate = Path(__file__).resolve().parents[2]
    if (candidate / "template.yaml").is_file() and (candidate / "functions").is_dir():
        return candidate
    return Path.cwd()


def load_module(path: str | Path) -> ModuleType:
    """Import the file at `path` once, under a module name unique to that file."""
    path = Path(path).resolve()
    with _modules_lock:
        module = _modules.get(path)
        if module is not None:
            return module
        try:
            relative = path.relative_to(repo_root())
        except ValueError:
            relative = path
        name = "freeinference_local_fn." + "_".join(relative.with_suffix("").parts).replace("-", "_")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[path] = module
        return module


def load_handler(
    function_dir: str, attribute: str = "lambda_handler", *, module: str = "app", root: Path | None = None
) -> Callable[..., Any]:
    """`load_handler("api", "lambda_handler")` -> functions/api/app.py's `lambda_handler`."""
    base = (root or repo_root()) / "functions" / function_dir
    return _handler_from(base, f"{module}.{attribute}")


def _handler_from(code_dir: Path, handler: str) -> Callable[..., Any]:
    # Lambda's `Handler` is `module.function`, the module possibly dotted (`pkg.mod.fn`).
    module_path, _, attribute = handler.rpartition(".")
    if not module_path:
        raise ValueError(f"handler {handler!r} is not module.function")
    module = load_module(code_dir.joinpath(*module_path.split(".")).with_suffix(".py"))
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"{module.__file__} has no {attribute!r}") from None


class LambdaContext:
    """The attributes and method of the Python runtime's context object that code reads."""

    def __init__(
        self,
        function_name: str,
        memory_limit_in_mb: int = 128,
        timeout_seconds: float = 3,
        region: str = LOCAL_REGION,
        account_id: str = LOCAL_ACCOUNT_ID,
        *,
        aws_request_id: str | None = None,
        deadline_epoch_ms: int | None = None,
    ) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account_id}:function:{function_name}"
        self.memory_limit_in_mb = int(memory_limit_in_mb)
        self.aws_request_id = aws_request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}"
        self.identity = None
        self.client_context = None
        # An execution environment gets its deadline from the parent as Lambda's runtime API gives
        # it (Lambda-Runtime-Deadline-Ms, epoch milliseconds); in-process, from the timeout.
        if deadline_epoch_ms is not None:
            self._deadline = time.monotonic() + (deadline_epoch_ms / 1000 - time.time())
        else:
            self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@dataclass
class FunctionSpec:
    """One `AWS::Serverless::Function` of the template, as the local stack runs it."""

    logical_id: str
    name: str
    code_dir: Path
    handler_name: str
    timeout: float
    memory_mb: int
    properties: dict[str, Any]
    _handler: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def handler(self) -> Callable[..., Any]:
        if self._handler is None:
            self._handler = _handler_from(self.code_dir, self.handler_name)
        return self._handler

    def context(self) -> LambdaContext:
        return LambdaContext(self.name, self.memory_mb, self.timeout)

    @property
    def reserved_concurrency(self) -> int | None:
        reserved = self.properties.get("ReservedConcurrentExecutions")
        return int(reserved) if reserved else None

    def mapping_concurrency(self, properties: dict[str, Any]) -> int:
        """How many invocations one SQS event mapping of this function runs at once: its
        `ScalingConfig.MaximumConcurrency`, never above the reserved concurrency (Lambda would
        throttle the rest), else the reserved concurrency, else 5."""
        cap = (properties.get("ScalingConfig") or {}).get("MaximumConcurrency") or self.reserved_concurrency or 5
        if self.reserved_concurrency:
            cap = min(int(cap), self.reserved_concurrency)
        return int(cap)

    @property
    def concurrency(self) -> int:
        """The most execution environments the local stack runs for this function at once: its
        reserved concurrency (the template's API 50, each schedule 2, each worker its mapping's
        `MaximumConcurrency`), else what its SQS mappings may run together, else
        `LOCAL_UNRESERVED_CONCURRENCY`."""
        if self.reserved_concurrency:
            return self.reserved_concurrency
        mappings = [p for p in self.events("SQS").values() if str(p.get("Enabled", True)).lower() != "false"]
        if mappings:
            return sum(self.mapping_concurrency(properties) for properties in mappings)
        return LOCAL_UNRESERVED_CONCURRENCY

    def events(self, event_type: str) -> dict[str, dict[str, Any]]:
        """Event name -> properties, for the function's events of `event_type` (`SQS`, `HttpApi`)."""
        return {
            name: event.get("Properties") or {}
            for name, event in (self.properties.get("Events") or {}).items()
            if event.get("Type") == event_type
        }


def functions_from_template(template: dict[str, Any], root: Path | None = None) -> dict[str, FunctionSpec]:
    root = root or repo_root()
    specs = {}
    for logical_id, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        properties = function_properties(template, logical_id)
        # The numbers the local stack runs a function by may name a parameter of the template
        # (`ReservedConcurrentExecutions: !Ref ApiReservedConcurrency`): its default, as deployed.
        for name in ("Timeout", "MemorySize", "ReservedConcurrentExecutions"):
            if name in properties:
                properties[name] = _parameter_default(template, properties[name])
        code_uri = properties.get("CodeUri")
        if not isinstance(code_uri, str):
            raise ValueError(f"{logical_id}: the local stack needs a local CodeUri path, got {code_uri!r}")
        specs[logical_id] = FunctionSpec(
            logical_id=logical_id,
            # A nested stack's function (`Block/Function`): "/" is not allowed in a function's name.
            name=properties.get("FunctionName") or f"{LOCAL_STACK_NAME}-{logical_id.replace('/', '-')}",
            code_dir=root / code_uri,
            handler_name=properties["Handler"],
            timeout=float(properties.get("Timeout", 3)),
            memory_mb=int(properties.get("MemorySize", 128)),
            properties=properties,
        )
    return specs


def _parameter_default(template: dict[str, Any], value: Any) -> Any:
    """`{"Ref": "Param"}` -> the parameter's `Default`; any other value as it is."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        parameter = (template.get("Parameters") or {}).get(value["Ref"])
        if parameter is None or "Default" not in parameter:
            raise ValueError(f"the local stack needs a default for the parameter {value['Ref']!r}")
        return parameter["Default"]
    return value
