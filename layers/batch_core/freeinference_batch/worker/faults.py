"""Fault injection for the chaos tests (`BATCH_FAULT_CRASH_RATE`, 0 outside them)."""

from __future__ import annotations

import random

from freeinference_batch.core.settings import Settings


class SimulatedCrash(BaseException):
    """Chaos tests only: the worker dies here, as a killed Lambda would (nothing cleans up)."""


def maybe_crash(settings: Settings, step: str) -> None:
    if settings.batch_fault_crash_rate and random.random() < settings.batch_fault_crash_rate:
        raise SimulatedCrash(step)
