"""The local stack: the whole service on one machine, without Docker.

`freeinference-batch dev` (`make dev`) runs it in the foreground (`dev.py`); tests may use
`LocalStack` in-process. Each function's invocations run as Lambda runs them, one event at a time
per execution environment, each environment a child process with its own module state
(`environments.py`); `LocalStack(isolated_functions=False)` runs them on threads of this process
instead, sharing module state (concurrent API requests can then read each other's event), for
the benchmarks' instruments that patch this process's handlers and boto3 clients only.
Everything comes from `template.yaml`: the tables, queues and bucket are created on a moto server
(`moto/`) from their `Properties`, and the functions' environment is the template's
`Globals.Function.Environment.Variables` with every `Ref`/`Fn::GetAtt`/`Fn::Sub` resolved as
CloudFormation would (`cloudformation/resources.py`), and each function's execution environments
get that function's own variables only (its `Environment` with the globals applied, as SAM does:
a model's worker its `WORKER_MODEL` and `UPSTREAM_API_KEY_SECRET`, no other function either);
the API routes (`api_gateway/`), SQS and DynamoDB stream event mappings and schedules
(`triggers/`) are the functions' `Events`. So a change to the template is a change to the local
stack, with no second copy. A nested application of a local template (one per model,
`model/template.yaml`) is expanded into the parent first (`cloudformation/template.py`): its
resources are `Block/Resource`.

`LOCAL_AWS_FAULTS` (and `LOCAL_AWS_FAULTS_SEED`) make its moto server inject AWS's failures into
the service's calls (`aws_faults/`): the functions, pollers and schedules run with
`AWS_SDK_UA_APP_ID` set, which marks their calls, once the stack's own setup is done.

Environment precedence: values that name a created resource (table names, queue URLs) always
come from the stack; any other template variable already set in the environment (BATCH_*,
UPSTREAM_*, ...) wins over its template default, which is how tests pass short durations.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from freeinference_batch.core import aws, clock
from freeinference_batch.core.settings import Settings, get_settings

from freeinference_batch_local.api_gateway.routes import routes_from_functions
from freeinference_batch_local.api_gateway.server import ApiGatewayServer
from freeinference_batch_local.aws_faults.config import APP_ID_ENV, SERVICE_APP_ID, config_from_env
from freeinference_batch_local.cloudformation.resources import (
    TemplateResources,
    function_environments,
    template_environment,
)
from freeinference_batch_local.cloudformation.template import load_template
from freeinference_batch_local.environments import EnvironmentPool, close_pools
from freeinference_batch_local.function_logs import InProcessOutput
from freeinference_batch_local.handlers import LOCAL_REGION, FunctionSpec, functions_from_template, repo_root
from freeinference_batch_local.metrics_forward import CloudWatchForwarder
from freeinference_batch_local.moto.process import MotoProcess
from freeinference_batch_local.sam_env import (
    SAMPLE_EVENTS_ACCOUNT,
    SAMPLE_EVENTS_KEY,
    sam_env_vars,
    write_sam_env,
)
from freeinference_batch_local.state import remove_state, write_state
from freeinference_batch_local.triggers.dynamodb_stream import stream_pollers
from freeinference_batch_local.triggers.schedules import schedule_timers
from freeinference_batch_local.triggers.sqs import queue_pollers
from freeinference_batch_local.upstream_sim import UpstreamSimulator

log = logging.getLogger("freeinference_batch_local")

DEFAULT_PORT = 8080
DEV_ACCOUNT_ID = "dev"
DEV_KEY_ENV = "FREEINFERENCE_DEV_KEY"


def _settings_env_names() -> set[str]:
    return {field.alias for field in Settings.model_fields.values() if field.alias}


class LocalStack:
    """The whole service: moto (a child process), resources, upstream, pollers, schedules, API,
    and each function's execution environments (child processes; see `isolated_functions`).

    `start()` returns self; `stop()` undoes everything (including the environment it set);
    usable as a context manager. After start: `base_url` ("http://127.0.0.1:PORT/v1"),
    `dev_key` (an internal-tier key of the account "dev"), `env` (every variable it applied),
    `pollers` / `timers` / `pools` (by function logical id; `pools` is empty in-process),
    `moto_endpoint`, `upstream` (None if UPSTREAM_BASE_URL was given).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        template_path: str | Path | None = None,
        root: str | Path | None = None,
        state_dir: str | Path | None = None,
        write_state_file: bool = True,
        env: dict[str, str] | None = None,
        moto_in_process: bool = False,
        isolated_functions: bool = True,
        logs: Any = None,
    ) -> None:
        self.root = Path(root) if root else repo_root()
        self.template_path = Path(template_path) if template_path else self.root / "template.yaml"
        self.host = host
        self.port = port
        self.state_dir = Path(state_dir) if state_dir else Path.cwd()
        self.write_state_file = write_state_file
        self.extra_env = dict(env or {})
        self.base_url = ""
        self.dev_key = ""
        self.env: dict[str, str] = {}
        self.moto_endpoint = ""
        self.moto: Any = None
        self.faults: Any = None  # the AWS faults its moto server injects (aws_faults.FaultConfig)
        # In this process only for instruments that reach into moto (the benchmarks' diagnoses).
        self.moto_in_process = moto_in_process
        # False only for instruments that reach into the handlers or their boto3 clients (the
        # benchmarks): the functions then run on threads here, without Lambda's isolation.
        self.isolated_functions = isolated_functions
        self.pools: dict[str, Any] = {}  # function logical id -> EnvironmentPool, when isolated
        # Where the functions' output goes (function_logs.FunctionLogs), their metrics forwarded
        # to moto's CloudWatch; None: to this process's stdout and stderr, metrics nowhere.
        self.logs = logs
        self._stdout_before: Any = None
        self.upstream: Any = None
        self.api: Any = None
        self.functions: dict[str, FunctionSpec] = {}
        self.pollers: dict[str, Any] = {}
        self.timers: dict[str, Any] = {}
        self.stream_pollers: dict[str, Any] = {}
        self.started_in: float | None = None
        self._saved_env: dict[str, str | None] = {}
        self._state_written = False
        # `.local-stack/sam-env.json`: the env-vars file for `sam local` (written with the state file).
        self.sam_env_file: Path | None = None

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalStack:
        started = time.perf_counter()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.perf_counter() - started
        log.info(
            "local stack ready in %.2f s: API %s, moto %s, upstream %s",
            self.started_in,
            self.base_url,
            self.moto_endpoint,
            self.env.get("UPSTREAM_BASE_URL"),
        )
        return self

    def _start(self) -> None:
        self._set_env(self.extra_env)
        # Before anything starts: a bad LOCAL_AWS_FAULTS is refused with its reason.
        self.faults = config_from_env()
        # The stack's own setup below must not carry the service's mark, whatever the shell set.
        self._unset_env(APP_ID_ENV)
        template = load_template(self.template_path)

        if self.moto_in_process:
            # Imported only here: moto's server (flask, every backend's index) is for the
            # processes that serve moto, this one only when asked to.
            from freeinference_batch_local.moto.server import MotoServer

            self.moto = MotoServer(host=self.host, faults=self.faults)
        else:
            self.moto = MotoProcess(host=self.host, faults=self.faults)
        self.moto_endpoint = self.moto.start()
        aws_env = {
            "AWS_ENDPOINT_URL": self.moto_endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_REGION": LOCAL_REGION,
        }
        # Never reach a real account: drop whatever could point boto3 elsewhere.
        for name in [*os.environ]:
            if name in {"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SECURITY_TOKEN"} or (
                name.startswith("AWS_ENDPOINT_URL_")
            ):
                self._unset_env(name)
        self._set_env(aws_env)

        session = boto3.session.Session(
            region_name=LOCAL_REGION, aws_access_key_id="test", aws_secret_access_key="test"
        )
        clients = {
            name: session.client(name, endpoint_url=self.moto_endpoint)
            for name in ("dynamodb", "sqs", "s3", "secretsmanager", "dynamodbstreams")
        }
        resources = TemplateResources(template, clients)
        resources.create_all()
        if self.logs is not None:
            # An app id of its own, not the service's (set below, inherited by clients made
            # later): the fault injector leaves the stack's stand-in for CloudWatch Logs alone.
            self.logs.metrics = CloudWatchForwarder(session.client(
                "cloudwatch", endpoint_url=self.moto_endpoint,
                config=Config(user_agent_appid="freeinference-batch-local-stack")))
        self._put_upstream_key(template, resources, clients["secretsmanager"])
        template_env, from_resources = template_environment(template, resources)
        env = {}
        for name, value in template_env.items():
            env[name] = os.environ[name] if name not in from_resources and name in os.environ else value

        # A developer's receiver on this machine may take webhook events over http (off in the template).
        env["WEBHOOK_ALLOW_LOOPBACK_HTTP"] = os.environ.get("WEBHOOK_ALLOW_LOOPBACK_HTTP", "true")
        if os.environ.get("UPSTREAM_BASE_URL"):
            env["UPSTREAM_BASE_URL"] = os.environ["UPSTREAM_BASE_URL"]
        else:
            self.upstream = UpstreamSimulator()
            env["UPSTREAM_BASE_URL"] = self.upstream.start(self.host)
        # No X-Ray daemon here; the rest of Powertools (logs, metrics) runs as on Lambda.
        env.setdefault("POWERTOOLS_TRACE_DISABLED", os.environ.get("POWERTOOLS_TRACE_DISABLED", "true"))
        self._set_env(env)
        for name in sorted(_settings_env_names()):  # settings the template does not set pass straight through
            if name in os.environ and name not in env:
                env[name] = os.environ[name]
        self.env = {**aws_env, **env}
        self._refresh_cached_config()

        # Imported only now: the service's modules make Powertools' logger, metrics and tracer as
        # they are imported, from the environment just set (as on Lambda, where it is set first).
        from freeinference_batch import accounts

        self.dev_key = accounts.create_key(
            get_settings(), DEV_ACCOUNT_ID, tier="internal", key=os.environ.get(DEV_KEY_ENV) or None
        )
        # The key the sample events carry, so `sam local invoke -e events/...` works against this stack.
        accounts.create_key(get_settings(), SAMPLE_EVENTS_ACCOUNT, tier="internal", key=SAMPLE_EVENTS_KEY)

        # Setup done: from here on every client of the service's (its functions', pollers',
        # schedules', and those of any process started with this environment) carries the mark the
        # fault injector looks for; clients made before it (the setup's) do not.
        service_mark = {APP_ID_ENV: SERVICE_APP_ID}
        self._set_env(service_mark)
        self.env.update(service_mark)
        self._refresh_cached_config()
        service_sqs = boto3.session.Session(
            region_name=LOCAL_REGION, aws_access_key_id="test", aws_secret_access_key="test"
        ).client("sqs", endpoint_url=self.moto_endpoint)

        self.functions = functions_from_template(template, self.root)
        if self.logs is not None:
            self.logs.function_names.update({spec.logical_id: spec.name for spec in self.functions.values()})
            if not self.isolated_functions:
                # On threads the functions print their metrics to this process's stdout.
                self._stdout_before = sys.stdout
                sys.stdout = InProcessOutput(self.logs, sys.stdout)
        # The environments start after the mark is set: they inherit it with the rest of os.environ.
        if self.isolated_functions:
            self._start_pools(function_environments(template, resources, self.functions, os.environ))
        else:
            for spec in self.functions.values():
                _ = spec.handler  # import every handler now: a broken one fails the start, not a request
        for poller in queue_pollers(self.functions.values(), resources, service_sqs, self._invoker):
            self.pollers[poller.name] = poller.start()
        # The stream poller is Lambda's, but its SQS sends (OnFailure) and its stream reads are
        # made for the service, so they carry the mark and meet LOCAL_AWS_FAULTS like the rest.
        stream_clients = {
            "sqs": service_sqs,
            "dynamodbstreams": boto3.session.Session(
                region_name=LOCAL_REGION, aws_access_key_id="test", aws_secret_access_key="test"
            ).client("dynamodbstreams", endpoint_url=self.moto_endpoint),
        }
        for stream_poller in stream_pollers(self.functions.values(), resources, stream_clients, self._invoker):
            self.stream_pollers[stream_poller.name] = stream_poller.start()
        self._wake_pollers_on_send()
        timers = schedule_timers(self.functions.values(), self._invoker, interval=get_settings().batch_schedule_seconds,
                                 clock=lambda: clock.now(get_settings().clock_offset_file))
        for timer in timers:
            self.timers[timer.name] = timer.start()

        port = self.port if self.port is not None else int(os.environ.get("PORT") or DEFAULT_PORT)
        routes = routes_from_functions(self.functions.values(), self._invoker if self.isolated_functions else None)
        self.api = ApiGatewayServer(routes, host=self.host, port=port)
        self.base_url = self.api.start() + "/v1"
        if self.write_state_file:
            # Without the mark: the admin CLI and tests apply this environment, and are not the service.
            unmarked = {name: value for name, value in self.env.items() if name != APP_ID_ENV}
            write_state(unmarked, self.base_url, self.state_dir)
            self.sam_env_file = write_sam_env(sam_env_vars(template, resources, self.env), self.state_dir)
            self._state_written = True

    @staticmethod
    def _put_upstream_key(template: dict[str, Any], resources: TemplateResources, secrets: Any) -> None:
        """A credential given as UPSTREAM_API_KEY (a real upstream, run locally) also goes in the
        secret the workers name, so that `sam local`'s workers, which read it there, send it too."""
        key = os.environ.get("UPSTREAM_API_KEY")
        if not key:
            return
        for resource in (template.get("Resources") or {}).values():
            variables = ((resource.get("Properties") or {}).get("Environment") or {}).get("Variables") or {}
            if "UPSTREAM_API_KEY_SECRET" in variables:
                secrets.put_secret_value(SecretId=resources.resolve(variables["UPSTREAM_API_KEY_SECRET"]),
                                         SecretString=key)

    def _start_pools(self, environments: dict[str, dict[str, str]]) -> None:
        """An `EnvironmentPool` per function, with its own variables (`environments`), and one
        environment of each started now, side by side: a handler that cannot import fails the
        start, not a request, and each function's first invocation is warm (later ones cold-start
        when every environment is busy)."""
        for logical_id, spec in self.functions.items():
            self.pools[logical_id] = EnvironmentPool(
                spec,
                on_notice=lambda _what: self._wake_pollers(),
                on_output=self.logs.write if self.logs is not None else None,
                env=environments[logical_id],
            )
        failures: list[BaseException] = []

        def prewarm(pool: Any) -> None:
            try:
                pool.prewarm()
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=prewarm, args=(pool,), daemon=True) for pool in self.pools.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise RuntimeError(f"a function's execution environment did not start: {failures[0]}") from failures[0]

    def _invoker(self, spec: FunctionSpec) -> Any:
        """What invokes `spec`: its pool of execution environments, or in-process its handler."""
        return self.pools[spec.logical_id] if self.isolated_functions else spec.handler

    def _wake_pollers(self) -> None:
        for poller in self.pollers.values():
            poller.wake()

    def _wake_pollers_on_send(self) -> None:
        """Emulate long polling: whenever a function sends a message or makes one visible again,
        the pollers look at once. An execution environment says so in a notice frame the moment
        its call returns (runtime.py; `_start_pools` wakes the pollers for it) rather than the
        pool waking them when the invocation ends: a worker invocation runs chains for minutes
        and wakes other chains' messages meanwhile. In-process, the sends all go through the
        shared client of freeinference_batch.core.aws, whose calls are hooked here."""
        if self.isolated_functions:
            # The stream pollers then look every IDLE_SLEEP_SECONDS (0.25 s), about as often as
            # Lambda polls a stream: the functions' writes are in other processes.
            return
        events = aws.sqs().meta.events
        for operation in ("SendMessage", "SendMessageBatch", "ChangeMessageVisibility"):
            events.register(f"after-call.sqs.{operation}", lambda **_: self._wake_pollers())

        # In-process, a write of this process makes the stream pollers look at once (Lambda's see
        # a change within a second or so; this saves the tests their idle polls' wait).
        def wake_streams(**_: Any) -> None:
            for poller in self.stream_pollers.values():
                poller.wake()

        writes = aws.dynamodb().meta.events
        for operation in ("PutItem", "UpdateItem", "TransactWriteItems", "BatchWriteItem"):
            writes.register(f"after-call.dynamodb.{operation}", wake_streams)

    def stop(self) -> None:
        """Stop taking requests, let running invocations finish (briefly), then tear down."""
        if self.api is not None:
            with _logged("API server"):
                self.api.stop()
            self.api = None
        components = [*self.timers.values(), *self.pollers.values(), *self.stream_pollers.values()]
        for component in components:
            component.pause()
        for component in components:
            with _logged(f"{component.name}"):
                component.stop(timeout=5)
        self.timers, self.pollers, self.stream_pollers = {}, {}, {}
        if self.pools:
            with _logged("execution environments"):
                close_pools(list(self.pools.values()))
            self.pools = {}
        if self._stdout_before is not None:
            sys.stdout.flush()
            sys.stdout, self._stdout_before = self._stdout_before, None
        if self.logs is not None:
            with _logged("metrics forwarder"):
                self.logs.close_metrics()  # while moto still answers
        if self.upstream is not None:
            with _logged("upstream simulator"):
                self.upstream.stop()
            self.upstream = None
        if self.moto is not None:
            with _logged("moto server"):
                self.moto.stop()
            self.moto = None
        if self._state_written:
            if self.sam_env_file is not None:
                self.sam_env_file.unlink(missing_ok=True)
                self.sam_env_file = None
            remove_state(self.state_dir)
            self._state_written = False
        self._restore_env()

    # ------------------------------------------------------------ helpers

    def pause_workers(self) -> None:
        for poller in self.pollers.values():
            poller.pause()

    def resume_workers(self) -> None:
        for poller in self.pollers.values():
            poller.resume()

    def stats(self) -> dict[str, Any]:
        # moto's request count is known only with moto in this process (`moto_in_process`): else None.
        app = getattr(self.moto, "app", None)
        return {
            "pollers": {name: poller.stats() for name, poller in self.pollers.items()},
            "timers": {name: timer.stats() for name, timer in self.timers.items()},
            "stream_pollers": {name: poller.stats() for name, poller in self.stream_pollers.items()},
            "functions": {name: pool.stats() for name, pool in self.pools.items()},
            "moto_requests": app.requests if app is not None else None,
        }

    def _set_env(self, values: dict[str, str]) -> None:
        for name, value in values.items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = str(value)

    def _unset_env(self, name: str) -> None:
        self._saved_env.setdefault(name, os.environ.get(name))
        os.environ.pop(name, None)

    def _restore_env(self) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}
        self._refresh_cached_config()

    @staticmethod
    def _refresh_cached_config() -> None:
        get_settings.cache_clear()
        aws.reset_clients()


@contextlib.contextmanager
def _logged(what: str):
    try:
        yield
    except Exception:
        log.exception("stopping %s failed", what)
