"""The model catalog: which models exist, who may use them, what they cost, how many batch
requests each runs at once."""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, Field, field_validator

# Prices are per million tokens; cost is kept in integer nano-USD (1e-9 USD) so sums are exact.
# (Micro-USD would round a 16-token prompt at $0.10/M, 1.6 micro-USD, to a whole number.)
NANO_PER_USD = 1_000_000_000

# An SQS event source mapping's MaximumConcurrency is 2 to 1000 (AWS::Lambda::EventSourceMapping
# ScalingConfig); a worker's is 2 x its model's batch_concurrency (ModelInfo.worker_concurrency),
# so 500 is the largest batch capacity one model's worker can serve.
MAX_MAPPING_CONCURRENCY = 1000
MAX_BATCH_CONCURRENCY = MAX_MAPPING_CONCURRENCY // 2
# An invocation runs one chain per SQS record side by side, and is billed by GB-second while it
# waits on the upstream: the more records it takes, the less each request costs. Lambda takes an
# SQS BatchSize over 10 only with a batching window of at least 1 s. 24 chains and one large
# request is the most a 256 MB worker holds (worker/memory.py; tests/service/worker/test_memory.py).
SQS_BATCH_SIZE_WITHOUT_WINDOW = 10
MAX_WORKER_BATCH_SIZE = 24


class ModelInfo(BaseModel):
    input_usd_per_million_tokens: float = Field(ge=0)
    output_usd_per_million_tokens: float = Field(ge=0)
    tiers: list[str]
    batch_concurrency: int = Field(4, ge=1)
    # Interactive requests in flight at which the model gives no room to batches at all.
    interactive_capacity: int = Field(64, ge=1)

    @field_validator("batch_concurrency")
    @classmethod
    def _fits_one_worker(cls, value: int) -> int:
        if value > MAX_BATCH_CONCURRENCY:
            raise ValueError(
                f"batch_concurrency {value} is over {MAX_BATCH_CONCURRENCY}: its worker would need "
                f"2 x {value} = {2 * value} concurrent executions, and an SQS event source mapping's "
                f"MaximumConcurrency is at most {MAX_MAPPING_CONCURRENCY}"
            )
        return value

    @property
    def worker_concurrency(self) -> int:
        """The model worker's reserved concurrency and its SQS mapping's MaximumConcurrency: what
        template.yaml must pass as the model block's WorkerConcurrency (the tests check it).

        Twice the batch capacity: a chain runs request after request inside one invocation and
        keeps that invocation (and the record it came in) for as long as it runs, so with every
        slot taken up to batch_concurrency invocations are held by one chain each. The mapping must
        still be able to invoke for the messages of waiting and woken chains, or a woken chain's
        message waits in the queue until some held invocation ends, with its slot idle meanwhile.
        batch_concurrency >= 1 keeps it at or above the mapping's minimum, 2."""
        return 2 * self.batch_concurrency

    @property
    def worker_batch_size(self) -> int:
        """The SQS mapping's BatchSize, which the model's block passes as WorkerBatchSize: the
        chains one invocation runs side by side. Up to the batch capacity (more chains than slots
        would only wait), at least Lambda's 10 without a window, at most MAX_WORKER_BATCH_SIZE."""
        return min(MAX_WORKER_BATCH_SIZE, max(SQS_BATCH_SIZE_WITHOUT_WINDOW, self.batch_concurrency))

    @property
    def worker_batching_window_seconds(self) -> int:
        """The mapping's MaximumBatchingWindowInSeconds (WorkerBatchingWindowSeconds): none where
        Lambda allows it, since a woken chain should start at once; the 1 s minimum above 10."""
        return 1 if self.worker_batch_size > SQS_BATCH_SIZE_WITHOUT_WINDOW else 0

    def cost_nano(self, prompt_tokens: int, completion_tokens: int) -> int:
        # USD per million tokens == micro-USD per token == 1000 nano-USD per token.
        return round(
            prompt_tokens * self.input_usd_per_million_tokens * 1000
            + completion_tokens * self.output_usd_per_million_tokens * 1000
        )

    def batch_capacity(self, interactive_inflight: int) -> int:
        """How many batch requests may run now: the full setting when the model is idle, shrinking
        linearly with interactive load, none once interactive traffic fills the model."""
        load = max(0, interactive_inflight)
        if load >= self.interactive_capacity:
            return 0
        free_share = (self.interactive_capacity - load) / self.interactive_capacity
        return max(1, math.floor(self.batch_concurrency * free_share))


class Catalog(BaseModel):
    batch_tiers: list[str] = ["internal"]
    models: dict[str, ModelInfo]

    @field_validator("models")
    @classmethod
    def _queue_names(cls, models: dict[str, ModelInfo]) -> dict[str, ModelInfo]:
        suffixes: dict[str, str] = {}
        for model in models:
            if not re.fullmatch(MODEL_ID_PATTERN, model):
                raise ValueError(
                    f"model id {model!r}: only letters, digits, '.', '-' and '_' (its queues are named after it)"
                )
            other = suffixes.setdefault(queue_suffix(model), model)
            if other != model:
                raise ValueError(f"models {other!r} and {model!r} would share the queue {queue_suffix(model)!r}")
        return models

    def model_for_tier(self, model: str, tier: str) -> ModelInfo | None:
        """The model if it exists and `tier` may use it; None otherwise (callers report both as
        'not found', so a key cannot probe for models it may not use)."""
        info = self.models.get(model)
        if info is None or tier not in info.tiers:
            return None
        return info

    def tier_may_batch(self, tier: str) -> bool:
        return tier in self.batch_tiers


# Model ids the queues can be named after: SQS names allow letters, digits, "-" and "_" only.
MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def queue_suffix(model: str) -> str:
    """The end of `model`'s queue names (<stack>-model_<suffix>, <stack>-dlq_<suffix>): the id
    with every "." made "-", as model/template.yaml does with !Join/!Split."""
    return model.replace(".", "-")


def is_auto_model(model: str) -> bool:
    return model == "auto" or model.startswith("auto-")


@lru_cache(maxsize=4)
def load_catalog(path: str = "") -> Catalog:
    if path:
        with open(path) as handle:
            return Catalog.model_validate(json.load(handle))
    text = resources.files(__package__).joinpath("models.json").read_text()
    return Catalog.model_validate_json(text)
