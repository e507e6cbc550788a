"""Console function: API Gateway HTTP API (payload 2.0) `GET /`, `GET /console/{file+}` -> the web
console's static files, which live beside this file (static/) and ship with this function only."""

from functools import cache
from pathlib import Path

from aws_lambda_powertools.utilities.typing import LambdaContext
from freeinference_batch.core.observability import logger
from freeinference_batch.core.settings import get_settings
from freeinference_batch.ops.console_site import ConsoleSite, payload_origin

STATIC = Path(__file__).resolve().parent / "static"


@cache
def site() -> ConsoleSite:
    return ConsoleSite(STATIC, payload_origin(get_settings().payload_bucket_name))


@logger.inject_lambda_context(log_event=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    return site().answer(event)
