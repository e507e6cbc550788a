"""The worker: runs a model's request messages (see runner.py for a request's life)."""

from freeinference_batch.worker.claims import ACCESS_WAIT_SECONDS
from freeinference_batch.worker.faults import SimulatedCrash
from freeinference_batch.worker.outcomes import Done, Parked
from freeinference_batch.worker.runner import (
    FRESH_COPY_AFTER_RECEIVES,
    CredentialUnavailable,
    InvocationState,
    Worker,
    park_unrun,
)

__all__ = ["ACCESS_WAIT_SECONDS", "FRESH_COPY_AFTER_RECEIVES", "CredentialUnavailable", "Done", "InvocationState",
           "Parked", "SimulatedCrash", "Worker", "park_unrun"]
