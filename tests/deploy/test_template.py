"""template.yaml: it lints, it builds, and it keeps the invariants the rest of the system relies on.

The local stack creates its resources from this template, so a mistake here (a queue without a
dead-letter queue, a mapping allowed more concurrency than its function, a handler that does not
exist) would show up locally too, not only on AWS.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from freeinference_batch.core.catalog import Catalog, ModelInfo
from freeinference_batch.core.settings import Settings
from freeinference_batch.worker.memory import FUNCTION_MEMORY_MB
from freeinference_batch_local.stack import TemplateResources
from freeinference_batch_local.template import function_properties, load_template, resources_of_type

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
MODEL_TEMPLATE = REPO / "model" / "template.yaml"  # one nested application of it per model
MONITORING_TEMPLATE = REPO / "monitoring" / "template.yaml"  # the stack's other alarms, one nested application
EVENTS = REPO / "events"
SAM = REPO / ".tools" / "sam" / "bin" / "sam"
# Same as the Makefile's: lets the pyenv shim resolve python3.13, which `sam build` needs.
SAM_PYENV_VERSION = "3.11.7:3.13.0"

API_ROUTES = {
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("GET", "/v1/batches/{batch_id}/results"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
    ("DELETE", "/v1/batches/{batch_id}"),
    # OpenAI's webhook-endpoint API (webhooks.py), so the openai package's client.webhooks works.
    ("POST", "/v1/webhook_endpoints"),
    ("GET", "/v1/webhook_endpoints"),
    ("GET", "/v1/webhook_endpoints/{endpoint_id}"),
    ("POST", "/v1/webhook_endpoints/{endpoint_id}"),
    ("DELETE", "/v1/webhook_endpoints/{endpoint_id}"),
    ("POST", "/v1/webhook_endpoints/{endpoint_id}/rotate_secret"),
    ("POST", "/v1/webhook_endpoints/{endpoint_id}/test"),
    ("GET", "/v1/webhook_event_types"),
}
# The web console's files, on the same HTTP API (ConsoleFunction).
CONSOLE_ROUTES = {("GET", "/"), ("GET", "/console/{file+}")}
# Environment variables the functions read that are not `Settings` fields.
NON_SETTINGS_ENV = {
    "AWS_ENDPOINT_URL",  # read by boto3 itself
    "AWS_SDK_UA_APP_ID",  # read by botocore itself: the local stack's mark on the service's calls
    "WORKER_MODEL",
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_LOG_LEVEL",
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(TEMPLATE)


@pytest.fixture(scope="module")
def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Logical id -> properties with Globals applied, for every AWS::Serverless::Function."""
    return {
        logical_id: function_properties(template, logical_id)
        for logical_id in resources_of_type(template, "AWS::Serverless::Function")
    }


def _events_of_type(properties: dict[str, Any], event_type: str) -> list[dict[str, Any]]:
    return [e["Properties"] for e in properties.get("Events", {}).values() if e["Type"] == event_type]


def _workers(functions: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The models' workers: the functions that run one model's queue (WORKER_MODEL). Other
    SQS-triggered functions (the webhook deliveries) are not workers."""
    return {logical_id: properties for logical_id, properties in functions.items()
            if "WORKER_MODEL" in (properties.get("Environment") or {}).get("Variables", {})}


def _on_failure_destinations(functions: dict[str, dict[str, Any]]) -> set[str]:
    """Queues a stream mapping sends the records it gave up on to (DestinationConfig.OnFailure)."""
    return {
        _getatt_resource(event["DestinationConfig"]["OnFailure"]["Destination"])
        for properties in functions.values()
        for event in _events_of_type(properties, "DynamoDB")
        if "OnFailure" in (event.get("DestinationConfig") or {})
    }


def _getatt_resource(value: Any) -> str:
    assert isinstance(value, dict) and "Fn::GetAtt" in value, f"expected !GetAtt <Queue>.Arn, got {value!r}"
    resource, attribute = value["Fn::GetAtt"]
    assert attribute == "Arn"
    return resource


def _sample_event_names(properties: dict[str, Any]) -> list[str]:
    """The sample events a function must have: `<code dir>-*.json`; a schedule handler
    `<name>_handler` has `schedule-<name>.json`."""
    code_dir = Path(properties["CodeUri"]).name
    handler = properties["Handler"].partition(".")[2]
    if code_dir == "schedules":
        return [f"schedule-{handler.removesuffix('_handler')}.json"]
    return sorted(p.name for p in EVENTS.glob(f"{code_dir}-*.json"))


# ---------------------------------------------------------------- the loader


def test_loader_expands_short_form_tags(tmp_path: Path) -> None:
    # Given a template using every kind of short-form tag the project writes
    path = tmp_path / "t.yaml"
    path.write_text(
        "AWSTemplateFormatVersion: 2010-09-09\n"
        "Conditions:\n"
        "  HasP: !Not [!Equals [!Ref P, '']]\n"
        "  Both: !And [!Condition HasP, !Or [!Condition HasP, !Condition HasP]]\n"
        "Resources:\n"
        "  R:\n"
        "    Properties:\n"
        "      A: !GetAtt Db.Endpoint.Address\n"
        "      B: !GetAtt [Q, Arn]\n"
        "      C: !Sub '${Q}/x'\n"
        "      D: !Sub ['${X}', {X: !Ref Q}]\n"
        "      E: !If [HasP, !Join ['', [a, b]], !Ref AWS::NoValue]\n"
        "      F: !Select [0, !GetAZs '']\n"
    )
    # When it is loaded
    template = load_template(path)
    # Then the tags become CloudFormation's long form and the version stays a string
    assert template["AWSTemplateFormatVersion"] == "2010-09-09"
    assert template["Conditions"]["HasP"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "P"}, ""]}]}
    assert template["Conditions"]["Both"] == {
        "Fn::And": [{"Condition": "HasP"}, {"Fn::Or": [{"Condition": "HasP"}, {"Condition": "HasP"}]}]
    }
    props = template["Resources"]["R"]["Properties"]
    assert props["A"] == {"Fn::GetAtt": ["Db", "Endpoint.Address"]}
    assert props["B"] == {"Fn::GetAtt": ["Q", "Arn"]}
    assert props["C"] == {"Fn::Sub": "${Q}/x"}
    assert props["D"] == {"Fn::Sub": ["${X}", {"X": {"Ref": "Q"}}]}
    assert props["E"] == {"Fn::If": ["HasP", {"Fn::Join": ["", ["a", "b"]]}, {"Ref": "AWS::NoValue"}]}
    assert props["F"] == {"Fn::Select": [0, {"Fn::GetAZs": ""}]}


def test_loader_expands_a_local_nested_application(tmp_path: Path) -> None:
    # Given a parent passing a literal, a Ref and a GetAtt to a child that uses them every way
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "t.yaml").write_text(
        "Parameters:\n  Name: {Type: String}\n  Arn: {Type: String}\n  Kept: {Type: String, Default: d}\n"
        "  Stack: {Type: String}\n"
        "Resources:\n"
        "  Q:\n    Type: AWS::SQS::Queue\n    Properties:\n"
        "      QueueName: !Sub '${Stack}-${Name}-${Kept}'\n"
        "      Other: !Sub ['${Q.Arn}/${X}', {X: !Ref Arn}]\n"
        "      Policy: !Sub '${Arn}/*'\n"
        "  F:\n    Type: AWS::Serverless::Function\n    DependsOn: Q\n    Properties:\n"
        "      CodeUri: ../code/\n      Queue: !GetAtt Q.Arn\n      Plain: !Sub 'no ${!variables}'\n"
    )
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  B:\n    Type: AWS::S3::Bucket\n"
        "  App:\n    Type: AWS::Serverless::Application\n    Properties:\n      Location: child/t.yaml\n"
        "      Parameters: {Name: n, Arn: !GetAtt B.Arn, Stack: !Ref AWS::StackName}\n"
    )
    # When the parent is loaded
    resources = load_template(tmp_path / "t.yaml")["Resources"]
    # Then the child's resources are the parent's, under App/, in the parent's terms
    assert set(resources) == {"B", "App", "App/Q", "App/F"}
    queue = resources["App/Q"]["Properties"]
    assert queue["QueueName"] == {"Fn::Sub": "${AWS::StackName}-n-d"}
    assert queue["Other"] == {"Fn::Sub": ["${App/Q.Arn}/${X}", {"X": {"Fn::GetAtt": ["B", "Arn"]}}]}
    assert queue["Policy"] == {"Fn::Sub": "${B.Arn}/*"}
    function = resources["App/F"]
    assert function["DependsOn"] == "App/Q"
    assert function["Properties"]["CodeUri"] == "code/"
    assert function["Properties"]["Queue"] == {"Fn::GetAtt": ["App/Q", "Arn"]}
    assert function["Properties"]["Plain"] == {"Fn::Sub": "no ${!variables}"}
    # And without `nested`, the block alone
    assert set(load_template(tmp_path / "t.yaml", nested=False)["Resources"]) == {"B", "App"}


def test_loader_reads_a_nested_applications_outputs_in_the_parents_terms(tmp_path: Path) -> None:
    # Given a child whose outputs name its own resource and a parameter, read by the parent
    (tmp_path / "child.yaml").write_text(
        "Parameters:\n  Topic: {Type: String}\n"
        "Resources:\n  A:\n    Type: AWS::CloudWatch::Alarm\n"
        "Outputs:\n  AArn: {Value: !GetAtt A.Arn}\n  Where: {Value: !Ref Topic}\n")
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  T:\n    Type: AWS::SNS::Topic\n"
        "  App:\n    Type: AWS::Serverless::Application\n    Properties:\n      Location: child.yaml\n"
        "      Parameters: {Topic: !Ref T}\n"
        "  D:\n    Type: AWS::CloudWatch::Dashboard\n    Properties:\n"
        "      Body: !Sub ['${X} ${App.Outputs.Where}', {X: !GetAtt App.Outputs.AArn}]\n"
        "      Named: !GetAtt [App, Outputs.AArn]\n"
        "Outputs:\n  O: {Value: !GetAtt App.Outputs.Where}\n")
    # When the parent is loaded
    template = load_template(tmp_path / "t.yaml")
    # Then each output reads as its value, in the parent's terms
    dashboard = template["Resources"]["D"]["Properties"]
    assert dashboard["Body"] == {"Fn::Sub": ["${X} ${T}", {"X": {"Fn::GetAtt": ["App/A", "Arn"]}}]}
    assert dashboard["Named"] == {"Fn::GetAtt": ["App/A", "Arn"]}
    assert template["Outputs"]["O"]["Value"] == {"Ref": "T"}
    # And an output the child does not have is refused
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  App:\n    Type: AWS::Serverless::Application\n    Properties:\n      Location: child.yaml\n"
        "      Parameters: {Topic: t}\n"
        "  D:\n    Type: AWS::CloudWatch::Dashboard\n    Properties:\n      Body: !GetAtt App.Outputs.Nope\n")
    with pytest.raises(ValueError, match="no output Nope"):
        load_template(tmp_path / "t.yaml")


def test_a_nested_template_may_not_use_its_own_stack_name(tmp_path: Path) -> None:
    # On AWS a nested stack's AWS::StackName is its own (<parent>-<Block>-<random>), not the
    # parent's: queue names built on it would miss the <stack>-model-* pattern.
    (tmp_path / "child.yaml").write_text(
        "Resources:\n  Q:\n    Type: AWS::SQS::Queue\n    Properties:\n"
        "      QueueName: !Sub '${AWS::StackName}-model-x'\n")
    (tmp_path / "t.yaml").write_text(
        "Resources:\n  App:\n    Type: AWS::Serverless::Application\n    Properties:\n"
        "      Location: child.yaml\n")
    with pytest.raises(ValueError, match="AWS::StackName"):
        load_template(tmp_path / "t.yaml")


def test_function_properties_apply_globals_as_sam_does(functions: dict[str, dict[str, Any]]) -> None:
    api = functions["ApiFunction"]
    assert api["Runtime"] == "python3.13"  # from Globals
    assert api["Timeout"] == 29  # the function's own value wins
    variables = api["Environment"]["Variables"]
    assert variables["BATCH_TABLE_NAME"] == {"Ref": "BatchTable"}  # maps merge, keeping the global keys
    # A nested stack's function gets its own template's Globals, never the parent's.
    worker = functions["GlmFlashModel/WorkerFunction"]
    assert worker["Timeout"] == 900 and worker["Runtime"] == "python3.13"  # model/template.yaml's own


def test_nested_applications_expand_into_the_parents_terms(template: dict[str, Any]) -> None:
    # Given the model block glm-5.3-flash, expanded
    worker = template["Resources"]["GlmFlashModel/WorkerFunction"]["Properties"]
    variables = worker["Environment"]["Variables"]
    # Then the child's parameters read as the values the block passes, in the parent's terms...
    assert variables["WORKER_MODEL"] == "glm-5.3-flash"
    assert variables["BATCH_TABLE_NAME"] == {"Ref": "BatchTable"}
    assert worker["Layers"] == [{"Ref": "BatchCoreLayer"}]
    assert worker["ReservedConcurrentExecutions"] == 8
    # ...its own resources are named under the block, and its paths are the parent's
    assert worker["Events"]["Requests"]["Properties"]["Queue"] == {"Fn::GetAtt": ["GlmFlashModel/Queue", "Arn"]}
    assert worker["CodeUri"] == "functions/worker/"
    assert template["Resources"]["GlmFlashModel/WorkerFunctionErrorsAlarm"]["Properties"]["AlarmDescription"] == (
        "The glm-5.3-flash worker failed (README runbook: Function errors).")
    # And the block itself is still there, unexpanded
    assert template["Resources"]["GlmFlashModel"]["Type"] == "AWS::Serverless::Application"


# ---------------------------------------------------------------- lint and build


def test_cfn_lint_reports_nothing() -> None:
    cfn_lint = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which("cfn-lint")
    assert cfn_lint, "cfn-lint is not installed (it is in the dev extras: make install)"
    result = subprocess.run([cfn_lint, "--", str(TEMPLATE), str(MODEL_TEMPLATE), str(MONITORING_TEMPLATE)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def _sam_env() -> dict[str, str]:
    env = {**os.environ, "PYENV_VERSION": SAM_PYENV_VERSION, "SAM_CLI_TELEMETRY": "0"}
    # Put a real python3.13 first on PATH too, in case the pyenv shims are not on it.
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for bin_dir in sorted(pyenv_root.glob("versions/3.13*/bin"), reverse=True):
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        break
    return env


@pytest.mark.slow
def test_sam_build_succeeds(tmp_path: Path, functions: dict[str, dict[str, Any]]) -> None:
    if not SAM.exists():
        message = f"{SAM.relative_to(REPO)} is missing: `make install` installs aws-sam-cli in its own venv"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # sam writes build.toml next to the build dir, so give it a folder of its own.
    build_dir = tmp_path / "build"
    started = time.monotonic()
    result = subprocess.run(
        [str(SAM), "build", "--template-file", str(TEMPLATE), "--build-dir", str(build_dir)],
        cwd=REPO,
        env=_sam_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(f"sam build took {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr

    for logical_id, properties in functions.items():
        module = properties["Handler"].partition(".")[0]
        assert (build_dir / logical_id / f"{module}.py").is_file(), f"{logical_id}: {module}.py not built"
    package = build_dir / "BatchCoreLayer" / "python" / "freeinference_batch"
    assert (package / "__init__.py").is_file()
    assert (package / "core" / "settings.py").is_file()
    assert (package / "core" / "models.json").is_file()
    # The service only: the client side and the local stack are other packages, never shipped.
    for moved in ("local", "cli", "client.py", "openai_files.py"):
        assert not (package / moved).exists(), f"the built layer has freeinference_batch/{moved}"
    # Binary wheels must be the Lambda runtime's (CPython 3.13 on arm64), not this machine's.
    layer = build_dir / "BatchCoreLayer" / "python"
    assert list(layer.glob("pydantic_core/*cpython-313-aarch64-linux-gnu.so")), "no arm64 cp313 pydantic_core"
    development_side = {"freeinference_batch_client", "freeinference_batch_local", "click", "tqdm", "moto"}
    assert not {p.name for p in layer.iterdir()} & development_side


# ---------------------------------------------------------------- structure


def test_no_fn_foreach() -> None:
    # The local stack and moto read the template as written; Fn::ForEach needs the
    # AWS::LanguageExtensions transform, which neither expands.
    for path in (TEMPLATE, MODEL_TEMPLATE, MONITORING_TEMPLATE):
        assert "ForEach" not in path.read_text(), path.relative_to(REPO)


def test_every_function_has_a_sample_event(functions: dict[str, dict[str, Any]]) -> None:
    for logical_id, properties in functions.items():
        names = _sample_event_names(properties)
        assert names, f"{logical_id}: no events/{Path(properties['CodeUri']).name}-*.json"
        for name in names:
            assert (EVENTS / name).is_file(), f"{logical_id}: events/{name} is missing"


def test_sample_events_are_valid_json() -> None:
    samples = sorted(EVENTS.glob("*.json"))
    assert samples
    for path in samples:
        json.loads(path.read_text())


def test_api_sample_events_cover_every_route() -> None:
    covered = set()
    for path in EVENTS.glob("api-*.json"):
        event = json.loads(path.read_text())
        assert event["version"] == "2.0", path.name
        method, _, route = event["routeKey"].partition(" ")
        assert event["requestContext"]["http"]["method"] == method, path.name
        assert event["requestContext"]["routeKey"] == event["routeKey"], path.name
        assert event["rawPath"] == event["requestContext"]["http"]["path"], path.name
        for name, value in (event.get("pathParameters") or {}).items():
            route = route.replace("{" + name + "}", value)
        assert route == event["rawPath"], f"{path.name}: pathParameters do not rebuild rawPath"
        covered.add(event["routeKey"])
    assert covered == {f"{method} {route}" for method, route in API_ROUTES}


def test_worker_sample_event_is_an_sqs_batch() -> None:
    event = json.loads((EVENTS / "worker-sqs.json").read_text())
    (record,) = event["Records"]
    assert record["eventSource"] == "aws:sqs"
    assert set(json.loads(record["body"])) == {"batch_id", "model", "index", "position"}


def test_every_handler_file_exists(functions: dict[str, dict[str, Any]]) -> None:
    for logical_id, properties in functions.items():
        module, _, handler = properties["Handler"].partition(".")
        source = REPO / properties["CodeUri"] / f"{module}.py"
        assert source.is_file(), f"{logical_id}: {source.relative_to(REPO)} does not exist"
        tree = ast.parse(source.read_text())
        defined = {
            node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        } | {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        assert handler in defined, f"{logical_id}: {source.relative_to(REPO)} defines no {handler}"


def _routes(properties: dict[str, Any]) -> set[tuple[str, str]]:
    return {(event["Method"].upper(), event["Path"]) for event in _events_of_type(properties, "HttpApi")
            if event.get("ApiId") == {"Ref": "BatchApi"}}


def test_api_has_its_routes(functions: dict[str, dict[str, Any]]) -> None:
    assert _routes(functions["ApiFunction"]) == API_ROUTES
    # The only other routes are the console's: the API stays under /v1, the console outside it.
    others = {logical_id: _routes(properties) for logical_id, properties in functions.items()
              if logical_id != "ApiFunction" and _routes(properties)}
    assert others == {"ConsoleFunction": CONSOLE_ROUTES}
    assert not any(path.startswith("/v1") for _, path in CONSOLE_ROUTES)


def test_the_console_ships_with_its_function_and_the_bucket_lets_it_read_body_urls(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    console = functions["ConsoleFunction"]
    static = REPO / console["CodeUri"] / "static"
    assert {"index.html", "console.js", "console.css"} <= {path.name for path in static.iterdir()}
    assert "Policies" not in console, "the console makes no AWS call: its role needs nothing"
    (rule,) = template["Resources"]["PayloadBucket"]["Properties"]["CorsConfiguration"]["CorsRules"]
    assert rule["AllowedMethods"] == ["GET"]
    assert rule["AllowedOrigins"] == [{"Fn::Sub": "https://*.execute-api.${AWS::Region}.${AWS::URLSuffix}"}]
    console_url = template["Outputs"]["ConsoleUrl"]["Value"]["Fn::Sub"]
    assert console_url.startswith("https://${BatchApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}")


def test_every_queue_has_a_dead_letter_queue(template: dict[str, Any],
                                             functions: dict[str, dict[str, Any]]) -> None:
    queues = resources_of_type(template, "AWS::SQS::Queue")
    dead_letter = {
        _getatt_resource(q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"])
        for q in queues.values()
        if "RedrivePolicy" in q.get("Properties", {})
    }
    # A stream mapping's OnFailure queue is a dead-letter queue too: nothing consumes it, an
    # operator reads it (README runbook), so it needs none of its own.
    on_failure = _on_failure_destinations(functions)
    assert on_failure <= set(queues), on_failure - set(queues)
    assert not on_failure & dead_letter
    work_queues = set(queues) - dead_letter - on_failure
    assert work_queues, "no work queues"
    max_attempts = template["Parameters"]["MaxAttempts"]["MaxValue"]
    for logical_id in work_queues:
        policy = queues[logical_id]["Properties"].get("RedrivePolicy")
        assert policy, f"{logical_id} has no RedrivePolicy"
        assert _getatt_resource(policy["deadLetterTargetArn"]) in queues
        # Each park is a receive; our own attempt counter decides retries, not SQS's.
        assert policy["maxReceiveCount"] >= max(100, 10 * max_attempts), logical_id


def test_sqs_mappings_respect_concurrency_and_visibility(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    queues = resources_of_type(template, "AWS::SQS::Queue")
    mapped = 0
    for logical_id, properties in functions.items():
        for event in _events_of_type(properties, "SQS"):
            mapped += 1
            reserved = properties.get("ReservedConcurrentExecutions")
            assert reserved, f"{logical_id}: an SQS worker needs reserved concurrency"
            assert event["ScalingConfig"]["MaximumConcurrency"] <= reserved, logical_id
            assert event["FunctionResponseTypes"] == ["ReportBatchItemFailures"], logical_id
            queue = queues[_getatt_resource(event["Queue"])]["Properties"]
            # AWS's guidance: visibility >= 6 x function timeout + batching window.
            window = event.get("MaximumBatchingWindowInSeconds", 0)
            assert queue["VisibilityTimeout"] >= 6 * properties["Timeout"] + window, logical_id
    assert mapped


def test_each_model_has_its_own_queue_and_worker(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    packaged = resources.files("freeinference_batch.core").joinpath("models.json")
    catalog = Catalog.model_validate_json(packaged.read_text())
    names = TemplateResources(template, clients={})  # resolves names only: creates nothing
    prefix = names.resolve(template["Globals"]["Function"]["Environment"]["Variables"]["MODEL_QUEUE_URL_PREFIX"])
    settings = Settings(MODEL_QUEUE_URL_PREFIX=prefix)  # type: ignore[call-arg]
    worker_queue = {}
    for logical_id, properties in _workers(functions).items():
        for event in _events_of_type(properties, "SQS"):
            model = properties["Environment"]["Variables"]["WORKER_MODEL"]
            assert model not in worker_queue, f"two workers for {model}"
            queue = template["Resources"][_getatt_resource(event["Queue"])]
            worker_queue[model] = names.resolve(queue["Properties"]["QueueName"])
            # Both caps are the one the catalog derives from the model's batch capacity; the
            # number is written in the model's block (CloudFormation cannot compute it).
            info = catalog.models[model]
            must = (f"template.yaml block {logical_id.split('/')[0]}: WorkerConcurrency must be "
                    f"{info.worker_concurrency} (2 x batch_concurrency {info.batch_concurrency} of {model} in "
                    "models.json; README \"Sizing a model\")")
            assert properties["ReservedConcurrentExecutions"] == info.worker_concurrency, must
            assert event["ScalingConfig"]["MaximumConcurrency"] == info.worker_concurrency, must
            sizes = (f"template.yaml block {logical_id.split('/')[0]}: WorkerBatchSize must be "
                     f"{info.worker_batch_size} and WorkerBatchingWindowSeconds "
                     f"{info.worker_batching_window_seconds} (for batch_concurrency {info.batch_concurrency} of "
                     f"{model} in models.json; README \"Sizing a model\")")
            assert event["BatchSize"] == info.worker_batch_size, sizes
            assert event["MaximumBatchingWindowInSeconds"] == info.worker_batching_window_seconds, sizes
    assert set(worker_queue) == set(catalog.models)
    # The code finds each model's queue by name: the URL it derives is the queue's URL.
    for model, queue_name in worker_queue.items():
        assert settings.model_queue_url(model).rsplit("/", 1)[1] == queue_name, model


PER_MODEL_PARAMETERS = ("ModelId", "WorkerConcurrency", "WorkerBatchSize", "WorkerBatchingWindowSeconds")


def test_every_model_block_passes_the_same_shared_resources() -> None:
    # One block per model: its ModelId and its sizes, then the same shared values.
    root = load_template(TEMPLATE, nested=False)
    child = load_template(MODEL_TEMPLATE, nested=False)
    applications = {i: r["Properties"] for i, r in resources_of_type(root, "AWS::Serverless::Application").items()}
    blocks = {i: p for i, p in applications.items() if p["Location"] == "model/template.yaml"}
    assert blocks, "no model blocks"
    # The one other nested application is the alarms'.
    assert [p["Location"] for i, p in applications.items() if i not in blocks] == ["monitoring/template.yaml"]
    shared = []
    for logical_id, properties in blocks.items():
        assert set(properties["Parameters"]) == set(child["Parameters"]), logical_id
        shared.append({k: v for k, v in properties["Parameters"].items() if k not in PER_MODEL_PARAMETERS})
    assert all(values == shared[0] for values in shared)
    assert shared[0]["StackName"] == {"Ref": "AWS::StackName"}


def test_a_worker_has_the_environment_every_function_has(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    # A nested stack has its own Globals: model/template.yaml repeats the root's environment,
    # and must keep repeating it as it is (plus what only a worker has).
    global_env = template["Globals"]["Function"]["Environment"]["Variables"]
    assert _workers(functions)
    for logical_id, properties in _workers(functions).items():
        if _events_of_type(properties, "SQS"):
            own = properties["Environment"]["Variables"]
            assert {k: v for k, v in own.items() if k not in ("WORKER_MODEL", "UPSTREAM_API_KEY_SECRET")} == global_env
            assert own["UPSTREAM_API_KEY_SECRET"] == {"Ref": "UpstreamApiKeySecret"}, logical_id
            for key in ("Runtime", "Architectures", "Tracing", "Layers"):
                assert properties[key] == template["Globals"]["Function"][key], (logical_id, key)
            # Its own memory, which its permits for large requests are sized by by default
            assert properties["MemorySize"] == FUNCTION_MEMORY_MB, logical_id


def test_queue_names_fit_sqs_for_the_documented_stack_name_length(template: dict[str, Any]) -> None:
    # README: the stack name is at most 55 characters; SQS names are at most 80.
    names = TemplateResources(template, clients={})
    for logical_id, queue in resources_of_type(template, "AWS::SQS::Queue").items():
        name = names.resolve(queue["Properties"]["QueueName"])
        assert len(name.replace(names.stack_name, "s" * 55)) <= 80, (logical_id, name)


def test_global_environment_names_are_settings(template: dict[str, Any]) -> None:
    # A typo here would silently fall back to a default in settings.py.
    aliases = {field.alias for field in Settings.model_fields.values()}
    names = set(template["Globals"]["Function"]["Environment"]["Variables"])
    assert names - NON_SETTINGS_ENV <= aliases, names - NON_SETTINGS_ENV - aliases


def test_batch_table_matches_the_architecture(template: dict[str, Any]) -> None:
    table = template["Resources"]["BatchTable"]
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    properties = table["Properties"]
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    types = {a["AttributeName"]: a["AttributeType"] for a in properties["AttributeDefinitions"]}
    indexes = {
        index["IndexName"]: [(k["AttributeName"], types[k["AttributeName"]]) for k in index["KeySchema"]]
        for index in properties["GlobalSecondaryIndexes"]
        if index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    }
    assert [(k["AttributeName"], types[k["AttributeName"]]) for k in properties["KeySchema"]] == [
        ("pk", "S"),
        ("sk", "S"),
    ]
    assert indexes == {
        "owner-index": [("owner", "S"), ("created_key", "S")],
        "open-index": [("open_shard", "S"), ("expires_at", "N")],
        "purge-index": [("purge_shard", "S"), ("purge_at", "N")],
    }


# ---------------------------------------------------------------- limits, logs, alarms


def _alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i: r["Properties"] for i, r in resources_of_type(template, "AWS::CloudWatch::Alarm").items()}


def _alarm_on(alarms: dict[str, dict[str, Any]], namespace: str, metric: str, dimension: Any) -> list[dict[str, Any]]:
    return [a for a in alarms.values() if a.get("Namespace") == namespace and a.get("MetricName") == metric
            and dimension in [d["Value"] for d in a.get("Dimensions", [])]]


def test_the_http_api_is_throttled_and_logs_every_request(template: dict[str, Any]) -> None:
    api = template["Resources"]["BatchApi"]["Properties"]
    throttling = api["DefaultRouteSettings"]
    assert throttling["ThrottlingBurstLimit"] == {"Ref": "ApiThrottlingBurstLimit"}
    assert throttling["ThrottlingRateLimit"] == {"Ref": "ApiThrottlingRateLimit"}
    for name in ("ApiThrottlingBurstLimit", "ApiThrottlingRateLimit"):
        assert template["Parameters"][name]["Default"] > 0
    logs = api["AccessLogSettings"]
    group = template["Resources"][logs["DestinationArn"]["Fn::GetAtt"][0]]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    line = json.loads(logs["Format"])  # one JSON object per request
    assert {"requestId", "routeKey", "status"} <= set(line)
    # Users' keys travel in headers: an access log never holds one.
    assert "header" not in logs["Format"].lower() and "authorization" not in logs["Format"].lower()


def test_every_function_logs_to_its_own_group_with_retention(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    assert template["Parameters"]["LogRetentionDays"]["Default"] == 30
    groups = set()
    for logical_id, properties in functions.items():
        group = properties["LoggingConfig"]["LogGroup"]["Ref"]
        assert template["Resources"][group]["Type"] == "AWS::Logs::LogGroup", logical_id
        assert template["Resources"][group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        groups.add(group)
    assert len(groups) == len(functions)


def test_alarms_cover_errors_throttles_schedules_api_and_tables(
    template: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> None:
    alarms = _alarms(template)
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    for logical_id, properties in functions.items():
        function = {"Ref": logical_id}
        assert _alarm_on(alarms, "AWS/Lambda", "Errors", function), f"{logical_id}: no Errors alarm"
        assert _alarm_on(alarms, "AWS/Lambda", "Throttles", function), f"{logical_id}: no Throttles alarm"
        if _events_of_type(properties, "Schedule"):
            (stopped,) = _alarm_on(alarms, "AWS/Lambda", "Invocations", function)
            # No invocation writes no data: missing data must count as breaching.
            assert stopped["TreatMissingData"] == "breaching", logical_id
            assert stopped["ComparisonOperator"] == "LessThanThreshold" and stopped["Threshold"] == 1
            rate = _events_of_type(properties, "Schedule")[0]["Schedule"]
            minutes = int(rate.split("(")[1].split()[0])
            assert stopped["Period"] * stopped["EvaluationPeriods"] >= 2 * 60 * minutes, logical_id
    assert _alarm_on(alarms, "AWS/ApiGateway", "5xx", {"Ref": "BatchApi"})
    for table in resources_of_type(template, "AWS::DynamoDB::Table"):
        metrics = [
            m["MetricStat"]["Metric"] for a in alarms.values() for m in a.get("Metrics", []) if "MetricStat" in m
            if {"Name": "TableName", "Value": {"Ref": table}} in m["MetricStat"]["Metric"]["Dimensions"]
        ]
        assert {m["MetricName"] for m in metrics} == {"ReadThrottleEvents", "WriteThrottleEvents"}, table


def test_every_alarm_has_a_runbook_entry_in_the_readme(template: dict[str, Any]) -> None:
    readme = (REPO / "README.md").read_text()
    for logical_id, alarm in _alarms(template).items():
        description = alarm["AlarmDescription"]
        if "README runbook: " in description:
            entry = description.split("README runbook: ")[1].rstrip(").")
            assert f"**{entry}**" in readme, f"{logical_id}: README has no runbook entry **{entry}**"


def test_reserved_concurrency_leaves_the_account_pool_documented(template: dict[str, Any]) -> None:
    readme = (REPO / "README.md").read_text()
    assert "admin --stack-name freeinference-batch --region us-east-1 preflight" in readme
    assert "100" in readme.split("### Lambda concurrency")[1].split("###")[0]


def test_the_readme_sizing_table_is_the_catalog_rule() -> None:
    # The operator sizes a model from this table, not from the code: each row must be what the
    # catalog derives, and its largest capacity must be one the catalog takes.
    section = (REPO / "README.md").read_text().split("### Sizing a model\n")[1].split("\n### ")[0]
    rows = [tuple(int(cell) for cell in line.strip("|").split("|")) for line in section.splitlines()
            if re.fullmatch(r"(\| \d+ )+\|", line)]
    assert [row[0] for row in rows] == [4, 16, 64, 128, 500]
    for row in rows:
        info = ModelInfo(input_usd_per_million_tokens=0, output_usd_per_million_tokens=0, tiers=[],
                         batch_concurrency=row[0])
        derived = (info.batch_concurrency, info.worker_concurrency, info.worker_batch_size,
                   info.worker_batching_window_seconds)
        assert row == derived, f"README row {row[0]}: it is {derived}"
    words = " ".join(section.split())
    assert "needs a quota increase first" in words and "admin --stack-name … preflight" in words


def test_the_upstream_timeout_fits_the_worker_invocation(template: dict[str, Any],
                                                         functions: dict[str, dict[str, Any]]) -> None:
    # What a deployed stack uses is the template's parameter: its default is the settings' default
    # (what the interactive endpoint allows), and its most is what a worker invocation can give one
    # call: the worker's Timeout less the settle time at each end (call_budget.longest_call).
    parameter = template["Parameters"]["UpstreamTimeoutSeconds"]
    defaults = Settings()  # type: ignore[call-arg]
    assert parameter["Default"] == defaults.batch_upstream_timeout_seconds == 600
    workers = _workers(functions)
    assert workers
    for logical_id, properties in workers.items():
        assert parameter["MaxValue"] == properties["Timeout"] - 2 * defaults.batch_settle_seconds, logical_id
    # A running request's lease outlasts the longest call and its settle, so the sweep never takes
    # back a live call, at the default and at the most the parameter allows
    for timeout in (parameter["Default"], parameter["MaxValue"]):
        config = Settings(BATCH_UPSTREAM_TIMEOUT_SECONDS=str(timeout))  # type: ignore[call-arg]
        assert config.lease_seconds >= timeout + config.batch_settle_seconds


def test_the_dashboard_shows_the_per_model_metrics_the_workers_publish_beside_the_alarms(
    template: dict[str, Any]
) -> None:
    from freeinference_batch.ops.operator_status import BATCH_CAP_METRIC, SLOTS_HELD_METRIC
    from freeinference_batch.worker.outcomes import COMPLETED_BY_MODEL, FAILED_BY_MODEL

    (dashboard,) = resources_of_type(template, "AWS::CloudWatch::Dashboard").values()
    body, variables = dashboard["Properties"]["DashboardBody"]["Fn::Sub"]
    text = re.sub(r"\$\{[^}]+\}", "x", body)  # as CloudFormation substitutes them: plain strings
    widgets = json.loads(text)["widgets"]
    expressions = json.dumps([w["properties"].get("metrics") for w in widgets])
    for metric in (COMPLETED_BY_MODEL, FAILED_BY_MODEL, BATCH_CAP_METRIC, SLOTS_HELD_METRIC):
        assert f'{{FreeInferenceBatch,model,service}} MetricName=\\"{metric}\\"' in expressions, metric
    (alarms,) = [w for w in widgets if w["type"] == "alarm"]
    assert len(alarms["properties"]["alarms"]) == len(variables)
    assert all(value["Fn::GetAtt"][1] == "Arn" and value["Fn::GetAtt"][0].endswith("Alarm")
               for value in variables.values())
