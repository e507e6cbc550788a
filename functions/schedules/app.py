"""Schedule functions: EventBridge rules -> expiry, recovery sweep, purge."""

from aws_lambda_powertools.utilities.typing import LambdaContext
from freeinference_batch.core.observability import logger, metrics, tracer
from freeinference_batch.core.settings import get_settings
from freeinference_batch.ops import schedules


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
def expire_handler(event: dict, context: LambdaContext) -> dict:
    result = schedules.expire(get_settings())
    metrics.add_metric(name="BatchesPastWindow", unit="Count", value=result["past_window"])
    logger.info("expire schedule ran", extra=result)
    return result


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
def sweep_handler(event: dict, context: LambdaContext) -> dict:
    result = schedules.sweep(get_settings())
    logger.info("sweep schedule ran", extra=result)
    return result


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler
def purge_handler(event: dict, context: LambdaContext) -> dict:
    result = schedules.purge(get_settings())
    logger.info("purge schedule ran", extra=result)
    return result
