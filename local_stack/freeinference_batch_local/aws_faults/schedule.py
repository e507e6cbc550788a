"""When a fault hits: each fault has its own `random.Random`, seeded from the seed and the fault's
name, and draws only for the calls that fault can hit; the moto server serves one request at a
time, so the schedule is a function of the seed and the sequence of calls it serves. Also the
count of each fault injected, which `GET /_local/faults` answers."""

from __future__ import annotations

import random
from collections import Counter

from freeinference_batch_local.aws_faults.config import FAULT_NAMES, FaultConfig


class FaultSchedule:
    """The faults of `config`: whether a call meets one (`hit`), the fault's own draws for what
    else it decides (`draw`), and how many times each was injected (`counts`)."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self.counts: Counter[str] = Counter()
        self._random = {name: random.Random(f"{config.seed}:{name}") for name in FAULT_NAMES}

    def hit(self, name: str) -> bool:
        rate = self.config.rate(name)
        return bool(rate) and self._random[name].random() < rate

    def draw(self, name: str) -> random.Random:
        return self._random[name]
