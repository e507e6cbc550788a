"""What invokes a function other than the API, on threads of the stack, one module per event
source as AWS names it: `sqs.py` (an SQS event source mapping), `dynamodb_stream.py` (a DynamoDB
stream event source mapping), `schedules.py` (an EventBridge schedule). Each reads its functions'
`Events` of its type from the template and takes as `handler` a function's `EnvironmentPool`
(environments.py: each invocation in an execution environment of its own, as Lambda runs it)
or, in-process, the handler itself. `event_source.py` is what they share."""
