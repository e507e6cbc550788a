"""Which AWS faults are on: `LOCAL_AWS_FAULTS` and `LOCAL_AWS_FAULTS_SEED` read and checked, and
the names the rest of the stack marks and asks for them by. No moto here: the stack's own
process, the admin CLI and the tests import this module alone."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

FAULTS_ENV = "LOCAL_AWS_FAULTS"
SEED_ENV = "LOCAL_AWS_FAULTS_SEED"
APP_ID_ENV = "AWS_SDK_UA_APP_ID"  # botocore adds `app/<value>` to every User-Agent it sends
SERVICE_APP_ID = "freeinference-batch-service"
FAULTS_PATH = "/_local/faults"

STALE_MS = "dynamodb.stale_ms"
# Every fault, in the order `admin faults` prints them.
FAULT_NAMES = (
    "dynamodb.throttle",
    "dynamodb.error",
    "dynamodb.lost_answer",
    "dynamodb.conflict",
    STALE_MS,
    "sqs.duplicate",
    "sqs.lost_answer",
    "sqs.failed_entry",
    "sqs.stale_receipt",
    "s3.lost_answer",
    "s3.error",
    "events.throttle",
    "events.error",
    "events.lost_answer",
    "events.failed_entry",
    "secretsmanager.throttle",
    "secretsmanager.error",
    "cloudwatch.throttle",
    "cloudwatch.error",
    "cloudwatch.lost_answer",
)


class FaultConfigError(ValueError):
    """LOCAL_AWS_FAULTS or LOCAL_AWS_FAULTS_SEED cannot be used; the message says why."""


@dataclass(frozen=True)
class FaultConfig:
    """The faults turned on (name -> rate, or ms for `dynamodb.stale_ms`) and the seed."""

    values: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0

    @property
    def enabled(self) -> bool:
        return any(self.values.values())

    def rate(self, name: str) -> float:
        return self.values.get(name, 0.0)

    def describe(self) -> str:
        """The faults on, as LOCAL_AWS_FAULTS writes them (parse_faults reads it back)."""
        return ",".join(
            f"{name}={int(value) if name == STALE_MS else repr(value)}"
            for name in FAULT_NAMES if (value := self.values.get(name))
        )


def parse_faults(text: str | None, seed_text: str | None = None) -> FaultConfig:
    """`LOCAL_AWS_FAULTS` and `LOCAL_AWS_FAULTS_SEED` as a FaultConfig; FaultConfigError names
    what is wrong (an unknown name, a bad value, a name given twice, a seed that is no integer)."""
    values: dict[str, float] = {}
    for entry in (text or "").split(","):
        entry = entry.strip()
        if not entry:
            if text and text.strip():
                raise FaultConfigError(f"{FAULTS_ENV}={text!r}: an empty entry (two commas, or one at an end)")
            continue
        name, equals, value = (part.strip() for part in entry.partition("="))
        if name not in FAULT_NAMES:
            raise FaultConfigError(
                f"{FAULTS_ENV}: unknown fault {name!r}; known: {', '.join(FAULT_NAMES)}"
            )
        if not equals or not value:
            raise FaultConfigError(f"{FAULTS_ENV}: {name} needs a value ({name}={'MS' if name == STALE_MS else 'R'})")
        if name in values:
            raise FaultConfigError(f"{FAULTS_ENV}: {name} is given twice")
        values[name] = _stale_ms(value) if name == STALE_MS else _rate(name, value)
    if seed_text is None or not seed_text.strip():
        seed = secrets.randbelow(2**32)
    else:
        try:
            seed = int(seed_text.strip())
        except ValueError:
            raise FaultConfigError(f"{SEED_ENV}={seed_text!r} is not an integer") from None
    return FaultConfig(values, seed)


def _rate(name: str, value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:  # also refuses nan
        raise FaultConfigError(f"{FAULTS_ENV}: {name}={value!r}: the rate must be a number from 0 to 1")
    return rate


def _stale_ms(value: str) -> float:
    try:
        milliseconds = int(value)
    except ValueError:
        milliseconds = -1
    if milliseconds < 0:
        raise FaultConfigError(f"{FAULTS_ENV}: {STALE_MS}={value!r}: give whole milliseconds, 0 or more")
    return float(milliseconds)


def config_from_env(environ: Mapping[str, str] | None = None) -> FaultConfig:
    environ = os.environ if environ is None else environ
    return parse_faults(environ.get(FAULTS_ENV), environ.get(SEED_ENV))
