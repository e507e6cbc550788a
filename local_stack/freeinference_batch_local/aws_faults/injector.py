"""The WSGI app around moto's that injects the faults: who is faulted (only calls whose
User-Agent carries the service's mark), each call sent to its service's faults, and the counts
on `GET /_local/faults`. `wrap` is what the moto server puts between its lock and moto."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from freeinference_batch_local.aws_faults.config import FAULTS_PATH, SEED_ENV, SERVICE_APP_ID, FaultConfig
from freeinference_batch_local.aws_faults.dynamodb import DynamoDBFaults
from freeinference_batch_local.aws_faults.s3 import S3Faults
from freeinference_batch_local.aws_faults.schedule import FaultSchedule
from freeinference_batch_local.aws_faults.services import ServiceFaults, service_call
from freeinference_batch_local.aws_faults.sqs import SqsFaults
from freeinference_batch_local.aws_faults.wsgi import (
    Answer,
    CountsOnly,
    WsgiApp,
    counts_answer,
    forward,
    read_request,
    scope,
)

log = logging.getLogger(__name__)

_SERVICE_MARK = f"app/{SERVICE_APP_ID}"


def wrap(app: WsgiApp, config: FaultConfig) -> WsgiApp:
    """The moto WSGI app with `config`'s faults, or only the counts' path when none is on."""
    if config.enabled:
        log.warning("AWS faults on: %s (%s=%d)", config.describe(), SEED_ENV, config.seed)
        return FaultInjector(app, config)
    return CountsOnly(app)


class FaultInjector:
    """The moto WSGI app with faults (see the package's docstring). Not thread-safe: it runs inside
    SerializedWsgiApp's lock, as moto does."""

    def __init__(self, app: WsgiApp, config: FaultConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.config = config
        self.schedule = FaultSchedule(config)
        self.counts = self.schedule.counts
        self.dynamodb = DynamoDBFaults(self.schedule, self._forward, clock)
        self.sqs = SqsFaults(self.schedule, self._forward)
        self.s3 = S3Faults(self.schedule, self._forward)
        self.services = ServiceFaults(self.schedule, self._forward)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            return counts_answer(self.counts, start_response)
        if self.dynamodb.replicas is not None:
            self.dynamodb.replicas.apply_due()
        target = environ.get("HTTP_X_AMZ_TARGET") or ""
        marked = _SERVICE_MARK in (environ.get("HTTP_USER_AGENT") or "")
        if target.startswith("DynamoDB_"):
            answer = self.dynamodb.answer(target.partition(".")[2], read_request(environ, marked))
        elif marked and target.startswith("AmazonSQS."):
            answer = self.sqs.answer(target.partition(".")[2], read_request(environ, marked))
        elif marked and not target and scope(environ)[2] == "s3":
            answer = self.s3.answer(read_request(environ, marked))
        elif marked:
            request = read_request(environ, marked)
            call = service_call(environ, request.body)
            if call is None:  # a service without faults: as it came (its body readable again)
                return self.app(request.fresh(), start_response)
            answer = self.services.answer(*call, request)
        else:
            return self.app(environ, start_response)
        start_response(answer.status, answer.headers)
        return [answer.body]

    def _forward(self, environ: dict[str, Any]) -> Answer:
        return forward(self.app, environ)
