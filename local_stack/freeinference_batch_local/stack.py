"""The local stack: the whole service on one machine, without Docker.

`freeinference-batch dev` (`make dev`) runs `run_local_stack()`; tests may use `LocalStack`
in-process. Each function's invocations run as Lambda runs them, one event at a time per
execution environment, each environment a child process with its own module state
(`environments.py`); `LocalStack(isolated_functions=False)` runs them on threads of this process
instead, sharing module state (concurrent API requests can then read each other's event), for
the benchmarks' instruments that patch this process's handlers and boto3 clients only.
Everything comes from `template.yaml`: the tables, queues and bucket are created on
a moto server from their `Properties`; the functions' environment is the template's
`Globals.Function.Environment.Variables` with every `Ref`/`Fn::GetAtt`/`Fn::Sub` resolved as
CloudFormation would; the API routes, SQS event mappings and schedules are the functions'
`Events`. So a change to the template is a change to the local stack, with no second copy. A
nested application of a local template (one per model, `model/template.yaml`) is expanded into
the parent first (`local/template.py`): its resources are `Block/Resource`.

`LOCAL_AWS_FAULTS` (and `LOCAL_AWS_FAULTS_SEED`) make its moto server inject AWS's failures into
the service's calls (`aws_faults.py`): the functions, pollers and schedules run with
`AWS_SDK_UA_APP_ID` set, which marks their calls, once the stack's own setup is done.

Environment precedence: values that name a created resource (table names, queue URLs) always
come from the stack; any other template variable already set in the environment (BATCH_*,
UPSTREAM_*, ...) wins over its template default, which is how tests pass short durations.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from freeinference_batch_local.aws_faults import FaultConfigError
from freeinference_batch_local.handlers import (
    LOCAL_ACCOUNT_ID,
    LOCAL_REGION,
    LOCAL_STACK_NAME,
    FunctionSpec,
    functions_from_template,
    repo_root,
)
from freeinference_batch_local.sam_env import (
    SAMPLE_EVENTS_ACCOUNT,
    SAMPLE_EVENTS_KEY,
    sam_env_vars,
    write_sam_env,
)
from freeinference_batch_local.template import load_template

log = logging.getLogger("freeinference_batch_local")

DEFAULT_PORT = 8080
DEV_ACCOUNT_ID = "dev"
DEV_KEY_ENV = "FREEINFERENCE_DEV_KEY"
LOCAL_HOST_ENV = "LOCAL_STACK_HOST"
_SUPPORTED_TYPES = ("AWS::DynamoDB::Table", "AWS::SQS::Queue", "AWS::S3::Bucket", "AWS::SecretsManager::Secret")
_PSEUDO = {
    "AWS::Region": LOCAL_REGION,
    "AWS::AccountId": LOCAL_ACCOUNT_ID,
    "AWS::StackName": LOCAL_STACK_NAME,
    "AWS::StackId": f"arn:aws:cloudformation:{LOCAL_REGION}:{LOCAL_ACCOUNT_ID}:stack/{LOCAL_STACK_NAME}/0",
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}
# Attribute names of SQS queue properties that pass through as-is (CloudFormation -> SetQueueAttributes).
_QUEUE_ATTRIBUTES = (
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "DelaySeconds",
    "FifoQueue",
    "FifoThroughputLimit",
    "KmsDataKeyReusePeriodSeconds",
    "KmsMasterKeyId",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "SqsManagedSseEnabled",
    "VisibilityTimeout",
)
_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")


# ---------------------------------------------------------------- resources from the template


class TemplateResources:
    """Creates the template's tables, queues and buckets on demand and resolves intrinsics to them.

    `resolve()` creates a resource the first time something refers to it, so a queue's dead-letter
    queue exists before the queue's RedrivePolicy names its ARN, with no dependency sorting.
    """

    def __init__(self, template: dict[str, Any], clients: dict[str, Any], stack_name: str = LOCAL_STACK_NAME):
        self.template = template
        self.resources: dict[str, dict[str, Any]] = template.get("Resources") or {}
        self.parameters: dict[str, dict[str, Any]] = template.get("Parameters") or {}
        self.clients = clients
        self.stack_name = stack_name
        self.physical: dict[str, dict[str, Any]] = {}  # logical id -> {"Ref": ..., attribute: ...}
        self._creating: set[str] = set()

    def create_all(self) -> dict[str, dict[str, Any]]:
        for logical_id, resource in self.resources.items():
            if resource.get("Type") in _SUPPORTED_TYPES:
                self.ensure(logical_id)
        return self.physical

    def ensure(self, logical_id: str) -> dict[str, Any]:
        if logical_id in self.physical:
            return self.physical[logical_id]
        resource = self.resources.get(logical_id)
        if resource is None:
            raise KeyError(f"template has no resource {logical_id!r}")
        kind = resource.get("Type")
        if kind not in _SUPPORTED_TYPES:
            raise ValueError(f"the local stack cannot create {logical_id} ({kind}); only {', '.join(_SUPPORTED_TYPES)}")
        if logical_id in self._creating:
            raise ValueError(f"circular reference through {logical_id}")
        if "Condition" in resource:
            log.warning("%s has a Condition; the local stack creates it regardless", logical_id)
        self._creating.add(logical_id)
        try:
            properties = self.resolve(resource.get("Properties") or {})
            create = {
                "AWS::DynamoDB::Table": self._table,
                "AWS::SQS::Queue": self._queue,
                "AWS::S3::Bucket": self._bucket,
                "AWS::SecretsManager::Secret": self._secret,
            }[kind]
            self.physical[logical_id] = create(logical_id, properties)
        finally:
            self._creating.discard(logical_id)
        log.debug("created %s: %s", logical_id, self.physical[logical_id]["Ref"])
        return self.physical[logical_id]

    def _name(self, logical_id: str, limit: int) -> str:
        return f"{self.stack_name}-{logical_id}"[:limit]

    def _table(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        name = properties.get("TableName") or self._name(logical_id, 255)
        request: dict[str, Any] = {
            "TableName": name,
            "KeySchema": properties["KeySchema"],
            "AttributeDefinitions": properties["AttributeDefinitions"],
            "BillingMode": properties.get("BillingMode", "PROVISIONED"),
        }
        if request["BillingMode"] == "PROVISIONED":
            request["ProvisionedThroughput"] = properties.get(
                "ProvisionedThroughput", {"ReadCapacityUnits": 5, "WriteCapacityUnits": 5}
            )
        if properties.get("GlobalSecondaryIndexes"):
            request["GlobalSecondaryIndexes"] = [
                {
                    key: index[key]
                    for key in ("IndexName", "KeySchema", "Projection", "ProvisionedThroughput")
                    if key in index
                }
                for index in properties["GlobalSecondaryIndexes"]
            ]
        if properties.get("LocalSecondaryIndexes"):
            request["LocalSecondaryIndexes"] = [
                {key: index[key] for key in ("IndexName", "KeySchema", "Projection") if key in index}
                for index in properties["LocalSecondaryIndexes"]
            ]
        if properties.get("StreamSpecification"):
            request["StreamSpecification"] = {"StreamEnabled": True, **properties["StreamSpecification"]}
        dynamodb = self.clients["dynamodb"]
        description = dynamodb.create_table(**request)["TableDescription"]
        ttl = properties.get("TimeToLiveSpecification")
        if ttl and _truthy(ttl.get("Enabled")):
            dynamodb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
            )
        return {
            "Ref": name,
            "Arn": description["TableArn"],
            "StreamArn": description.get("LatestStreamArn", ""),
        }

    def _queue(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        fifo = _truthy(properties.get("FifoQueue"))
        name = properties.get("QueueName") or self._name(logical_id, 75 if fifo else 80) + (".fifo" if fifo else "")
        attributes = {key: _attribute(properties[key]) for key in _QUEUE_ATTRIBUTES if key in properties}
        for key in ("RedrivePolicy", "RedriveAllowPolicy"):
            if key in properties:
                value = properties[key]
                attributes[key] = value if isinstance(value, str) else json.dumps(value)
        sqs = self.clients["sqs"]
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return {"Ref": url, "Arn": arn, "QueueName": name, "QueueUrl": url}

    def _bucket(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        name = properties.get("BucketName") or re.sub(r"[^a-z0-9.-]", "-", self._name(logical_id, 63).lower())
        self.clients["s3"].create_bucket(Bucket=name)
        return {
            "Ref": name,
            "Arn": f"arn:aws:s3:::{name}",
            "DomainName": f"{name}.s3.amazonaws.com",
            "RegionalDomainName": f"{name}.s3.{LOCAL_REGION}.amazonaws.com",
        }

    def _secret(self, logical_id: str, properties: dict[str, Any]) -> dict[str, Any]:
        # As CloudFormation does: the given SecretString, else a generated value (the template's
        # secrets are placeholders an operator replaces; the simulated upstream ignores them).
        name = properties.get("Name") or self._name(logical_id, 512)
        value = properties.get("SecretString")
        if value is None:
            import secrets

            value = secrets.token_urlsafe(24)
        arn = self.clients["secretsmanager"].create_secret(Name=name, SecretString=value)["ARN"]
        return {"Ref": arn, "Id": arn}

    # ------------------------------------------------------------ intrinsics

    def resolve(self, value: Any, used: set[str] | None = None) -> Any:
        """`value` with intrinsics resolved; logical ids of resources it refers to are added to `used`."""
        if isinstance(value, list):
            return [self.resolve(item, used) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._ref(argument, used)
            if key == "Fn::GetAtt":
                resource, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
                return self._get_att(resource, attribute, used)
            if key == "Fn::Sub":
                return self._sub(argument, used)
            if key == "Fn::Join":
                delimiter, items = argument
                return str(delimiter).join(_env_string(item) for item in self.resolve(items, used))
            if key == "Fn::Split":
                delimiter, source = argument
                return str(self.resolve(source, used)).split(str(delimiter))
            if key == "Fn::Select":
                index, items = argument
                return self.resolve(items, used)[int(self.resolve(index, used))]
            if key.startswith("Fn::"):
                raise ValueError(f"the local stack does not resolve {key}; keep local-stack properties literal")
        return {key: self.resolve(item, used) for key, item in value.items()}

    def _ref(self, name: str, used: set[str] | None) -> Any:
        if name in _PSEUDO:
            return _PSEUDO[name]
        if name in self.parameters:
            return self.parameters[name].get("Default", "")
        if used is not None:
            used.add(name)
        return self.ensure(name)["Ref"]

    def _get_att(self, resource: str, attribute: str, used: set[str] | None) -> Any:
        if used is not None:
            used.add(resource)
        physical = self.ensure(resource)
        if attribute not in physical:
            raise ValueError(f"the local stack has no {resource}.{attribute}")
        return physical[attribute]

    def _sub(self, argument: Any, used: set[str] | None) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        values = {name: self.resolve(item, used) for name, item in variables.items()}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in values:
                return _env_string(values[name])
            if "." in name and name.split(".", 1)[0] not in self.parameters:
                return _env_string(self._get_att(*name.split(".", 1), used))
            return _env_string(self._ref(name, used))

        return _SUB_VARIABLE.sub(replace, text)


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def _attribute(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _env_string(value: Any) -> str:
    """How CloudFormation renders a value in a string (environment variables are strings)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def template_environment(template: dict[str, Any], resources: TemplateResources) -> tuple[dict[str, str], set[str]]:
    """Globals.Function.Environment.Variables resolved, and the names whose values name a resource."""
    variables = ((template.get("Globals") or {}).get("Function") or {}).get("Environment", {}).get("Variables") or {}
    env, from_resources = {}, set()
    for name, value in variables.items():
        used: set[str] = set()
        env[name] = _env_string(resources.resolve(value, used))
        if used:
            from_resources.add(name)
    return env, from_resources


def _settings_env_names() -> set[str]:
    from freeinference_batch.core.settings import Settings

    return {field.alias for field in Settings.model_fields.values() if field.alias}


# ---------------------------------------------------------------- the stack


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
        import boto3

        from freeinference_batch_local import aws_faults
        from freeinference_batch_local.apigw import ApiGatewayServer, routes_from_functions
        from freeinference_batch_local.moto_server import MotoProcess, MotoServer

        self._set_env(self.extra_env)
        # Before anything starts: a bad LOCAL_AWS_FAULTS is refused with its reason.
        self.faults = aws_faults.config_from_env()
        # The stack's own setup below must not carry the service's mark, whatever the shell set.
        self._unset_env(aws_faults.APP_ID_ENV)
        template = load_template(self.template_path)

        moto_class = MotoServer if self.moto_in_process else MotoProcess
        self.moto = moto_class(host=self.host, faults=self.faults)
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
            from botocore.config import Config

            from freeinference_batch_local.metrics_forward import CloudWatchForwarder

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
            from freeinference_batch_local.upstream_sim import UpstreamSimulator

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

        from freeinference_batch import accounts
        from freeinference_batch.core.settings import get_settings

        self.dev_key = accounts.create_key(
            get_settings(), DEV_ACCOUNT_ID, tier="internal", key=os.environ.get(DEV_KEY_ENV) or None
        )
        # The key the sample events carry, so `sam local invoke -e events/...` works against this stack.
        accounts.create_key(get_settings(), SAMPLE_EVENTS_ACCOUNT, tier="internal", key=SAMPLE_EVENTS_KEY)

        # Setup done: from here on every client of the service's (its functions', pollers',
        # schedules', and those of any process started with this environment) carries the mark the
        # fault injector looks for; clients made before it (the setup's) do not.
        service_mark = {aws_faults.APP_ID_ENV: aws_faults.SERVICE_APP_ID}
        self._set_env(service_mark)
        self.env.update(service_mark)
        self._refresh_cached_config()
        service_sqs = boto3.session.Session(
            region_name=LOCAL_REGION, aws_access_key_id="test", aws_secret_access_key="test"
        ).client("sqs", endpoint_url=self.moto_endpoint)

        self.functions = functions_from_template(template, self.root)
        self._warn_per_function_env(template)
        if self.logs is not None:
            self.logs.function_names.update({spec.logical_id: spec.name for spec in self.functions.values()})
            if not self.isolated_functions:
                from freeinference_batch_local.function_logs import InProcessOutput

                # On threads the functions print their metrics to this process's stdout.
                self._stdout_before = sys.stdout
                sys.stdout = InProcessOutput(self.logs, sys.stdout)
        # The environments start after the mark is set: they inherit it with the rest of os.environ.
        if self.isolated_functions:
            self._start_pools()
        else:
            for spec in self.functions.values():
                _ = spec.handler  # import every handler now: a broken one fails the start, not a request
        self._start_pollers(resources, service_sqs)
        # The stream poller is Lambda's, but its SQS sends (OnFailure) and its stream reads are
        # made for the service, so they carry the mark and meet LOCAL_AWS_FAULTS like the rest.
        self._start_stream_pollers(resources, {
            "sqs": service_sqs,
            "dynamodbstreams": boto3.session.Session(
                region_name=LOCAL_REGION, aws_access_key_id="test", aws_secret_access_key="test"
            ).client("dynamodbstreams", endpoint_url=self.moto_endpoint),
        })
        self._wake_pollers_on_send()
        self._start_timers()

        port = self.port if self.port is not None else int(os.environ.get("PORT") or DEFAULT_PORT)
        routes = routes_from_functions(self.functions.values(), self._invoker if self.isolated_functions else None)
        self.api = ApiGatewayServer(routes, host=self.host, port=port)
        self.base_url = self.api.start() + "/v1"
        if self.write_state_file:
            from freeinference_batch_local.state import write_state

            # Without the mark: the admin CLI and tests apply this environment, and are not the service.
            unmarked = {name: value for name, value in self.env.items() if name != aws_faults.APP_ID_ENV}
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

    def _start_pools(self) -> None:
        """An `EnvironmentPool` per function, and one environment of each started now, side by
        side: a handler that cannot import fails the start, not a request, and each function's
        first invocation is warm (later ones cold-start when every environment is busy)."""
        from freeinference_batch_local.environments import EnvironmentPool

        for logical_id, spec in self.functions.items():
            self.pools[logical_id] = EnvironmentPool(
                spec,
                on_notice=lambda _what: self._wake_pollers(),
                on_output=self.logs.write if self.logs is not None else None,
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
        from freeinference_batch.core import aws

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

    def _start_pollers(self, resources: TemplateResources, sqs: Any) -> None:
        from freeinference_batch_local.pollers import QueuePoller

        urls_by_arn = {
            physical["Arn"]: physical["QueueUrl"] for physical in resources.physical.values() if "QueueUrl" in physical
        }
        for spec in self.functions.values():
            for event_name, properties in spec.events("SQS").items():
                if not _truthy(properties.get("Enabled", True)):
                    continue
                arn = resources.resolve(properties["Queue"])
                name = spec.logical_id if len(spec.events("SQS")) == 1 else f"{spec.logical_id}.{event_name}"
                self.pollers[name] = QueuePoller(
                    name=name,
                    sqs=sqs,
                    queue_url=urls_by_arn[arn],
                    queue_arn=arn,
                    handler=self._invoker(spec),
                    batch_size=int(properties.get("BatchSize", 10)),
                    max_batching_window=float(properties.get("MaximumBatchingWindowInSeconds") or 0),
                    max_concurrency=spec.mapping_concurrency(properties),
                    report_batch_item_failures="ReportBatchItemFailures"
                    in (properties.get("FunctionResponseTypes") or ()),
                    context_factory=spec.context,
                ).start()

    def _start_stream_pollers(self, resources: TemplateResources, clients: dict[str, Any]) -> None:
        from freeinference_batch_local.pollers import StreamPoller

        urls_by_arn = {
            physical["Arn"]: physical["QueueUrl"] for physical in resources.physical.values() if "QueueUrl" in physical
        }
        for spec in self.functions.values():
            for event_name, properties in spec.events("DynamoDB").items():
                if not _truthy(properties.get("Enabled", True)):
                    continue
                on_failure = ((properties.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
                name = spec.logical_id if len(spec.events("DynamoDB")) == 1 else f"{spec.logical_id}.{event_name}"
                self.stream_pollers[name] = StreamPoller(
                    name=name,
                    streams=clients["dynamodbstreams"],
                    sqs=clients["sqs"],
                    stream_arn=resources.resolve(properties["Stream"]),
                    handler=self._invoker(spec),
                    batch_size=int(properties.get("BatchSize", 100)),
                    max_batching_window=float(properties.get("MaximumBatchingWindowInSeconds") or 0),
                    filters=(properties.get("FilterCriteria") or {}).get("Filters"),
                    max_retries=int(properties.get("MaximumRetryAttempts", -1)),
                    on_failure_queue_url=urls_by_arn.get(resources.resolve(on_failure)) if on_failure else None,
                    report_batch_item_failures="ReportBatchItemFailures"
                    in (properties.get("FunctionResponseTypes") or ()),
                    context_factory=spec.context,
                ).start()

    def _start_timers(self) -> None:
        from freeinference_batch.core import clock
        from freeinference_batch.core.settings import get_settings

        from freeinference_batch_local.pollers import ScheduleTimer

        settings = get_settings()
        for spec in self.functions.values():
            schedules = {**spec.events("Schedule"), **spec.events("ScheduleV2")}
            for event_name, properties in schedules.items():
                if not _truthy(properties.get("Enabled", True)) or properties.get("State") == "DISABLED":
                    continue
                self.timers[spec.logical_id] = ScheduleTimer(
                    name=spec.logical_id,
                    handler=self._invoker(spec),
                    interval=settings.batch_schedule_seconds,
                    max_concurrency=spec.concurrency,
                    context_factory=spec.context,
                    rule_name=f"{LOCAL_STACK_NAME}-{spec.logical_id}{event_name}",
                    clock=lambda: clock.now(get_settings().clock_offset_file),
                ).start()

    def _warn_per_function_env(self, template: dict[str, Any]) -> None:
        # Every function's execution environments inherit the stack's one set of variables: a
        # function's own variables do not apply to it alone.
        # Only those that change a setting matter (WORKER_MODEL-style labels are harmless).
        function_globals = (template.get("Globals") or {}).get("Function") or {}
        globals_env = (function_globals.get("Environment") or {}).get("Variables") or {}
        # The workers' UPSTREAM_API_KEY_SECRET is left out on purpose: locally they send
        # UPSTREAM_API_KEY (empty unless set: the simulated upstream needs no credential).
        settings_names = _settings_env_names() - {"UPSTREAM_API_KEY_SECRET"}
        for logical_id in self.functions:
            properties = template["Resources"][logical_id].get("Properties") or {}
            own = (properties.get("Environment") or {}).get("Variables") or {}
            clashing = sorted(name for name in own if name in settings_names and own[name] != globals_env.get(name))
            if clashing:
                log.warning(
                    "%s sets %s itself; the local stack runs every function with the global value",
                    logical_id,
                    ", ".join(clashing),
                )

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
            from freeinference_batch_local.environments import close_pools

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
            from freeinference_batch_local.state import remove_state

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
        from freeinference_batch.core import aws
        from freeinference_batch.core.settings import get_settings

        get_settings.cache_clear()
        aws.reset_clients()


@contextlib.contextmanager
def _logged(what: str):
    try:
        yield
    except Exception:
        log.exception("stopping %s failed", what)


# ---------------------------------------------------------------- `freeinference-batch dev`


class _OneLine(logging.Formatter):
    """The quiet terminal's form of the stack's own records: the first line of the message, no
    traceback (it is in `.local-stack/logs/local-stack.log`)."""

    def format(self, record: logging.LogRecord) -> str:
        first = (record.getMessage().splitlines() or [""])[0]
        return f"{self.formatTime(record, '%H:%M:%S')} {record.levelname} {record.name.rsplit('.', 1)[-1]}: {first}"


def _not_logged_by_the_function(record: logging.LogRecord) -> bool:
    # A failed invocation the function logged itself (its ERROR line is already on the terminal)
    # is also logged by the poller, timer or API that called it: one terminal line per error.
    from freeinference_batch_local.environments import FunctionError

    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, FunctionError) and error.logged_by_function)


def _configure_logging(logs_dir: Path, verbose: bool) -> None:
    """The stack's own records: all of them to `local-stack.log`; to the terminal, all with
    `verbose`, else its warnings and errors, one line each."""
    full = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    to_file = logging.FileHandler(logs_dir / "local-stack.log", mode="w", encoding="utf-8")
    to_file.setFormatter(full)
    to_terminal = logging.StreamHandler(sys.stderr)
    if verbose:
        to_terminal.setFormatter(full)
    else:
        to_terminal.setLevel(logging.WARNING)
        to_terminal.setFormatter(_OneLine())
        to_terminal.addFilter(_not_logged_by_the_function)
    logging.basicConfig(level=os.environ.get("LOCAL_STACK_LOG_LEVEL", "INFO").upper(),
                        handlers=[to_file, to_terminal])


def run_local_stack(verbose: bool = False) -> None:
    """Run the local stack in the foreground until SIGINT/SIGTERM; exit normally (code 0) then.

    stdout gets exactly one line, the base URL and the dev key (the e2e tests read it). The
    functions' output goes to `.local-stack/logs/<function>.jsonl` (function_logs.py), the
    stack's own log to `.local-stack/logs/local-stack.log`; stderr gets a readable line per batch
    status change and per error, or with `verbose` every log line.
    """
    from freeinference_batch_local.function_logs import LOGS_DIR, FunctionLogs
    from freeinference_batch_local.state import STATE_DIR

    logs_dir = Path.cwd() / STATE_DIR / LOGS_DIR
    logs_dir.mkdir(parents=True, exist_ok=True)
    _configure_logging(logs_dir, verbose)
    logs = FunctionLogs(logs_dir, sys.stderr, verbose=verbose)
    stop = threading.Event()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second Ctrl-C while stopping: leave at once
            os._exit(128 + signum)
        log.info("%s: stopping the local stack", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)

    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # fd 1 is stderr from now on: only our one line reaches the real stdout
    # 127.0.0.1 unless LOCAL_STACK_HOST says otherwise: on Linux, `sam local`'s containers reach
    # the host only on an address other than loopback (LOCAL_STACK_HOST=0.0.0.0, README).
    stack = LocalStack(host=os.environ.get(LOCAL_HOST_ENV) or "127.0.0.1", logs=logs)
    try:
        try:
            stack.start()
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            log.error("cannot start the local stack: %s (set PORT to another port, or PORT=0 for any)", error)
            raise SystemExit(1) from None
        except FaultConfigError as error:
            log.error("cannot start the local stack: %s", error)
            raise SystemExit(1) from None
        if not stop.is_set():
            line = f"FreeInference Batch local stack on {stack.base_url} — dev key: {stack.dev_key}\n"
            os.write(real_stdout, line.encode("utf-8"))
        while not stop.wait(0.5):
            pass
    finally:
        stack.stop()
        logs.close()
        log.info("local stack stopped")
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
