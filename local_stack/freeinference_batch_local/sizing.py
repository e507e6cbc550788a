"""A model deployed at another capacity, as README "Sizing a model" says an operator does it: the
catalog with the model's `batch_concurrency` changed, and a copy of template.yaml whose model block
passes the worker sizes the catalog derives from it (WorkerConcurrency, WorkerBatchSize,
WorkerBatchingWindowSeconds). The benchmarks and the end-to-end test of a model sized at 500 run
the local stack on the two files."""

from __future__ import annotations

import json
import re
from pathlib import Path

from freeinference_batch.core.catalog import ModelInfo


def write_catalog(repo: Path, directory: Path | str, concurrency: int, models: list[str] | None = None) -> Path:
    """The packaged catalog with `batch_concurrency` set to `concurrency` (for `models`, default
    all), written to `directory`/catalog.json: pass it as MODEL_CATALOG_PATH to the stack."""
    catalog = json.loads((repo / "layers" / "batch_core" / "freeinference_batch" / "core" / "models.json").read_text())
    for name, model in catalog["models"].items():
        if models is None or name in models:
            model["batch_concurrency"] = concurrency
    path = Path(directory) / "catalog.json"
    path.write_text(json.dumps(catalog, indent=2))
    return path


def write_sized_template(repo: Path, directory: Path | str, concurrency: int, model: str) -> Path:
    """template.yaml with `model`'s block sized for a `batch_concurrency` of `concurrency`, written to
    `directory`/template.yaml: pass it to the stack with the catalog `write_catalog` writes."""
    info = ModelInfo(input_usd_per_million_tokens=0, output_usd_per_million_tokens=0, tiers=[],
                     batch_concurrency=concurrency)
    sizes = {"WorkerConcurrency": info.worker_concurrency, "WorkerBatchSize": info.worker_batch_size,
             "WorkerBatchingWindowSeconds": info.worker_batching_window_seconds}
    text = (repo / "template.yaml").read_text()
    # A block is the lines from its logical id to the next resource; its parameters are literal.
    blocks = re.split(r"(?m)^(?=  [A-Za-z0-9]+:\n)", text)
    found = [i for i, block in enumerate(blocks) if re.search(rf"(?m)^ +ModelId: {re.escape(model)}$", block)]
    if len(found) != 1:
        raise ValueError(f"template.yaml has {len(found)} blocks for {model}")
    block = blocks[found[0]]
    for name, value in sizes.items():
        block, count = re.subn(rf"(?m)^( +{name}: )\S+$", rf"\g<1>{value}", block)
        if count != 1:
            raise ValueError(f"the block of {model} passes {count} {name}")
    blocks[found[0]] = block
    # Written elsewhere, the nested applications' templates (model/, monitoring/) are named by path.
    sized = re.sub(r"(?m)^( +Location: )(?!/)(\S+)$", lambda found: f"{found.group(1)}{repo / found.group(2)}",
                   "".join(blocks))
    path = Path(directory) / "template.yaml"
    path.write_text(sized)
    return path
