"""The model's batch cap follows the upstream's answers (AIMD, see model_backoff.py): lowered on
an overload answer, raised back on success."""

from __future__ import annotations

from botocore.exceptions import ClientError

from freeinference_batch.core.catalog import Catalog
from freeinference_batch.core.observability import logger
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table
from freeinference_batch.worker import model_backoff, upstream
from freeinference_batch.worker.outcomes import Claimed, metric


def adjust_model_cap(settings: Settings, catalog: Catalog, claimed: Claimed, outcome: upstream.Outcome,
                     now: float) -> None:
    """Best effort: it only tunes how much runs at once."""
    model_name = claimed.message.model
    model = catalog.models.get(model_name)
    if model is None:
        return
    # Each write is conditional on the backoff the claim's gates read (none: no backoff).
    backoff = claimed.backoff
    seen_cap, seen_at = (backoff.cap, backoff.changed_at) if backoff is not None else (None, None)
    try:
        if outcome.kind == "retry" and (outcome.error or {}).get("code") in model_backoff.OVERLOAD_CODES:
            cap = model_backoff.lowered(claimed.capacity, backoff, now, settings.batch_backoff_cooldown_seconds)
            if cap is not None and accounts_table.set_model_cap(settings, model_name, cap, now, seen_cap=seen_cap,
                                                                seen_at=seen_at):
                metric("ModelCapLowered")
                logger.warning("model overloaded: batch cap lowered", extra={"model": model_name, "cap": cap})
        elif outcome.kind == "completed" and backoff is not None:
            cap = model_backoff.raised(model.batch_concurrency, backoff, now, settings.batch_recovery_seconds)
            if cap is None:
                return
            if cap >= model.batch_concurrency:
                accounts_table.end_model_backoff(settings, model_name, seen_cap=backoff.cap, seen_at=backoff.changed_at)
            else:
                accounts_table.set_model_cap(settings, model_name, cap, now, seen_cap=seen_cap, seen_at=seen_at)
    except ClientError:
        logger.exception("could not adjust the model's batch cap", extra={"model": model_name})
