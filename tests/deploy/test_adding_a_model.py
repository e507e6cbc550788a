"""Adding a model is one catalog entry and one block in template.yaml, and nothing else.

On a copy of the repo's template, model template, catalog and functions, a third model gets its
catalog entry and a copy of an existing model's block (its name, ModelId and WorkerConcurrency
changed, the last to what the catalog derives from the new model's batch_concurrency). Then the
templates (both levels) lint clean and agree with the catalog, and a local stack started from
the copy creates the model's queues and worker poller from it and runs the model's requests
to completion, beside the other two models'.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from freeinference_batch.core.catalog import Catalog, queue_suffix
from freeinference_batch_local.cloudformation.template import load_template, resources_of_type
from freeinference_batch_local.handlers import LOCAL_STACK_NAME, functions_from_template
from freeinference_batch_local.stack import LocalStack

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "layers" / "batch_core" / "freeinference_batch" / "core" / "models.json"
NEW_MODEL = "llama-4.1-8b"
NEW_BLOCK = "Llama41Model"


def _a_block(text: str) -> tuple[str, str, str]:
    """An existing model block of template.yaml: (its logical id, its text, its ModelId)."""
    found = re.search(r"^  (\w+):\n    Type: AWS::Serverless::Application\n(?:(?: {4}.*)?\n)+", text, flags=re.M)
    assert found, "template.yaml has no model block (AWS::Serverless::Application)"
    block = found.group(0).rstrip("\n") + "\n"
    model = re.search(r"^        ModelId: (\S+)$", block, flags=re.M)
    assert model, f"{found.group(1)} passes no ModelId"
    return found.group(1), block, model.group(1)


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo's templates, catalog and functions, with a third model added the README's way."""
    root = tmp_path_factory.mktemp("three-models")
    shutil.copytree(REPO / "model", root / "model")
    shutil.copytree(REPO / "monitoring", root / "monitoring")
    shutil.copytree(REPO / "functions", root / "functions", ignore=shutil.ignore_patterns("__pycache__"))
    # 1. one catalog entry
    catalog = json.loads(CATALOG.read_text())
    catalog["models"][NEW_MODEL] = {"input_usd_per_million_tokens": 0.05, "output_usd_per_million_tokens": 0.1,
                                    "tiers": ["internal", "standard"], "batch_concurrency": 2,
                                    "interactive_capacity": 32}
    (root / "models.json").write_text(json.dumps(catalog, indent=2))
    # 2. one block: an existing model's, under a new name, with the new ModelId and the
    # WorkerConcurrency its batch_concurrency (2, unlike the copied model's) gives
    text = (REPO / "template.yaml").read_text()
    name, block, model = _a_block(text)
    workers = Catalog.model_validate(catalog).models[NEW_MODEL].worker_concurrency
    new_block, replaced = re.subn(r"^(        WorkerConcurrency: )\d+$", rf"\g<1>{workers}", block, flags=re.M)
    assert replaced == 1, f"{name} passes no WorkerConcurrency"
    new_block = new_block.replace(f"  {name}:", f"  {NEW_BLOCK}:", 1).replace(f"ModelId: {model}",
                                                                             f"ModelId: {NEW_MODEL}")
    changed = text.replace(block, block + "\n" + new_block, 1)
    assert len(changed.splitlines()) - len(text.splitlines()) == len(new_block.splitlines()) + 1
    (root / "template.yaml").write_text(changed)
    return root


def test_the_copy_lints_clean(copy: Path) -> None:
    cfn_lint = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or shutil.which("cfn-lint")
    assert cfn_lint, "cfn-lint is not installed (it is in the dev extras: make install)"
    result = subprocess.run([cfn_lint, "--", str(copy / "template.yaml"), str(copy / "model" / "template.yaml")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_the_template_and_the_catalog_agree(copy: Path) -> None:
    catalog = Catalog.model_validate_json((copy / "models.json").read_text())
    template = load_template(copy / "template.yaml")
    functions = functions_from_template(template, copy)
    # The model workers: the functions that name their model (webhook deliveries read SQS too).
    workers = {variables["WORKER_MODEL"]: logical_id for logical_id, spec in functions.items()
               if "WORKER_MODEL" in (variables := (spec.properties.get("Environment") or {}).get("Variables") or {})}
    assert set(workers) == set(catalog.models) == {"glm-5.3-flash", "qwen3.6-35b", NEW_MODEL}
    assert workers[NEW_MODEL] == f"{NEW_BLOCK}/WorkerFunction"
    # Each worker reserves what the catalog derives from its model's capacity, the new one too.
    for model, logical_id in workers.items():
        assert functions[logical_id].properties["ReservedConcurrentExecutions"] == \
            catalog.models[model].worker_concurrency, logical_id
        mapping = next(iter(functions[logical_id].events("SQS").values()))
        assert mapping["BatchSize"] == catalog.models[model].worker_batch_size, logical_id
    # Its queues, log group and alarms came with the block; no other resource changed.
    before = load_template(REPO / "template.yaml")
    added = set(template["Resources"]) - set(before["Resources"])
    child = load_template(copy / "model" / "template.yaml")
    assert added == {NEW_BLOCK} | {f"{NEW_BLOCK}/{r}" for r in child["Resources"]}
    for logical_id, resource in before["Resources"].items():
        if "/" not in logical_id and logical_id != NEW_BLOCK:
            assert template["Resources"][logical_id] == resource, f"{logical_id} changed"
    alarms = resources_of_type(template, "AWS::CloudWatch::Alarm")
    assert {f"{NEW_BLOCK}/WorkerFunctionErrorsAlarm", f"{NEW_BLOCK}/WorkerFunctionThrottlesAlarm",
            f"{NEW_BLOCK}/DeadLetterAlarm"} <= set(alarms)


def _wait(done: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not done before the deadline"
        time.sleep(0.2)


def test_a_local_stack_from_the_copy_runs_the_new_model(copy: Path, tmp_path: Path) -> None:
    stack = LocalStack(port=0, template_path=copy / "template.yaml", root=copy, state_dir=tmp_path,
                       write_state_file=False,
                       env={"MODEL_CATALOG_PATH": str(copy / "models.json"), "BATCH_SCHEDULE_SECONDS": "1",
                            "BATCH_RETRY_BASE_SECONDS": "0.2", "POWERTOOLS_METRICS_DISABLED": "true"})
    with stack:
        # The new model's poller reads the queue its block made, named as the code finds it.
        assert f"{NEW_BLOCK}/WorkerFunction" in stack.pollers
        queue_url = stack.pollers[f"{NEW_BLOCK}/WorkerFunction"].queue_url
        assert queue_url.rsplit("/", 1)[1] == f"{LOCAL_STACK_NAME}-model_{queue_suffix(NEW_MODEL)}"
        assert stack.env["MODEL_QUEUE_URL_PREFIX"].endswith(f"/{LOCAL_STACK_NAME}-model_")
        # A batch with a request for each of the three models runs to completion.
        models = ["glm-5.3-flash", "qwen3.6-35b", NEW_MODEL]
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {stack.dev_key}"
        created = session.post(f"{stack.base_url}/batches", timeout=30, json={"requests": [
            {"custom_id": f"r-{model}", "body": {"model": model, "messages": [{"role": "user", "content": "Hi"}]}}
            for model in models]})
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]

        def finished() -> bool:
            return session.get(f"{stack.base_url}/batches/{batch_id}", timeout=30).json()["status"] == "completed"

        _wait(finished)
        page = session.get(f"{stack.base_url}/batches/{batch_id}/results", timeout=30).json()
        assert {line["custom_id"]: line["response"]["status_code"] for line in page["data"]} == {
            f"r-{model}": 200 for model in models}
