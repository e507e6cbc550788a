"""Status events function: the batch table's stream (META items) -> EventBridge events and
webhook deliveries, with a partial batch response (the first failed record and those after it
are retried, in order, as Lambda does for streams)."""

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from freeinference_batch.core.observability import logger, metrics, tracer
from freeinference_batch.core.settings import get_settings
from freeinference_batch.webhooks import status_events


def handle_record(record: DynamoDBRecord) -> None:
    told = status_events.handle_record(get_settings(), record.raw_event)
    if told is not None:
        logger.info("batch status change told", extra=told)


@metrics.log_metrics
@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict, context: LambdaContext) -> dict:
    processor = BatchProcessor(event_type=EventType.DynamoDBStreams, raise_on_entire_batch_failure=False)
    return process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
