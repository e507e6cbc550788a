"""AWS's bad days on demand: faults injected into the local stack's moto server.

`LOCAL_AWS_FAULTS` (comma-separated `name=value`) turns them on, `LOCAL_AWS_FAULTS_SEED` (an
integer) fixes their schedule. Each name reproduces one thing AWS does (how the service meets
each: docs/ARCHITECTURE.md, "Where the code relies on consistency, and on its own writes"):

- `dynamodb.throttle=R`: a share R of DynamoDB item calls answer `ThrottlingException` or
  `ProvisionedThroughputExceededException` (400) before anything is applied; botocore retries
  them, so only runs of them reach the code. A throttled `BatchGetItem`/`BatchWriteItem` instead
  leaves some of its keys in `UnprocessedKeys`/`UnprocessedItems` (all of them: the exception),
  as DynamoDB mostly does.
- `dynamodb.error=R`: `InternalServerError` (500) before anything is applied.
- `dynamodb.lost_answer=R`: a write (PutItem, UpdateItem, DeleteItem, BatchWriteItem,
  TransactWriteItems) is applied, then its answer is lost (a 500), so botocore sends it again: a
  conditional write sent again meets its own earlier success. `TransactWriteItems` carries a
  `ClientRequestToken` (botocore fills it in, and a retry re-sends it), which is emulated for
  every caller while any fault is on: the same token and request within 10 minutes answer the
  earlier success without applying again; the same token with another request answers
  `IdempotentParameterMismatchException`.
- `dynamodb.conflict=R`: a `TransactWriteItems` is cancelled with reason `TransactionConflict`
  on one of its items (`TransactionCanceledException`, one reason per item, the others `None`);
  a PutItem/UpdateItem/DeleteItem answers `TransactionConflictException`. Neither is retried by
  botocore. Never for a transaction its token has already applied (DynamoDB answers that one's
  success).
- `dynamodb.stale_ms=MS`: eventually consistent reads (GetItem, BatchGetItem, Query and Scan
  without `ConsistentRead`, and every query of a global secondary index) may answer items as
  they were up to MS ms earlier. Each table has a lagging replica inside moto's backend (same
  keys and indexes, named `<table>.lagging-replica`, hidden from ListTables); every write's
  resulting item images (read from moto after the write, from any caller) reach it at now +
  uniform(0, MS), in order per item, and are applied before each request is served. While a
  table's replica has nothing pending it equals the table and reads go to the table itself.
  Its count is of stale answers served: answers that differ from what the consistent read at
  that moment answers.
- `sqs.duplicate=R`: a message a ReceiveMessage returns is, with probability R, made visible
  again at once, so another receive gets the same MessageId with a new receipt handle.
- `sqs.lost_answer=R`: SendMessage(Batch), DeleteMessage(Batch), ChangeMessageVisibility(Batch)
  are applied, then answer a 500, so botocore sends them again (a message sent twice is two
  messages, as on SQS).
- `sqs.failed_entry=R`: an entry of SendMessageBatch, DeleteMessageBatch or
  ChangeMessageVisibilityBatch is not applied and is listed in the answer's `Failed`
  (`InternalError`, `SenderFault` false); the others are applied.
- `sqs.stale_receipt=R`: a DeleteMessage(Batch) by a receipt handle of a message's earlier
  receive (it was received again since) succeeds and deletes nothing, as SQS may (only the latest
  receipt handle surely deletes a message).
- `events.throttle=R`, `events.error=R`, `secretsmanager.throttle=R`, `secretsmanager.error=R`,
  `cloudwatch.throttle=R`, `cloudwatch.error=R`: the call answers the service's throttling error
  (400) or its internal error (500) before it is applied (botocore retries both).
- `events.lost_answer=R` (PutEvents), `cloudwatch.lost_answer=R` (PutMetricData): applied, then a
  500, so botocore sends it again (the events put twice, the data counted twice).
- `events.failed_entry=R`: a PutEvents entry is refused in its place (`ErrorCode`
  `InternalFailure`, counted in `FailedEntryCount`); the others are put.
- `s3.error=R` (any call: a 500 before it is applied), `s3.lost_answer=R` (a PUT, POST or DELETE
  applied, then a 500).

Only the service's own calls are faulted: those whose User-Agent carries `app/<SERVICE_APP_ID>`,
which botocore adds when `AWS_SDK_UA_APP_ID` is set. The local stack sets it for its functions,
pollers and schedules only after its own setup (tables, queues, the dev key), and leaves it out
of the state file the admin CLI and tests read; an unmarked caller is never faulted.

The errors are written as each service's protocol carries them, so that botocore classifies
them as AWS's own (`botocore.retries.standard`): DynamoDB and SQS (JSON protocol in the
installed botocore) a JSON body whose `__type` names the error, SQS also the
`x-amzn-query-error` header of its query-compatible errors; S3 an XML `<Error>`. 5xx and the
two throttling codes are retried; `TransactionCanceledException`,
`TransactionConflictException` and `IdempotentParameterMismatchException` (400) are not.

Determinism: each fault has its own `random.Random`, seeded from the seed and the fault's name,
and draws only for the calls that fault can hit. The server serves one request at a time, so
the fault schedule is a function of the seed and the sequence of calls it serves. Threads
interleave their calls differently from one run to the next, so a seed reproduces the
schedule, not a whole run of the stack; what a stale read answers also depends on how much time
passed. Without a seed one is drawn and logged.

With no fault configured the moto app is wrapped only to answer `GET /_local/faults` (the
counts, all 0): one string comparison per request. The counts: `GET /_local/faults` answers a
JSON object of every name and how many times it was injected; moto never sees that path (no S3
bucket can be named `_local`).

Where each part is: `config.py` (the names, `LOCAL_AWS_FAULTS` read and checked: the only part
the stack's own process imports), `schedule.py` (the seeded draws and the counts),
`injector.py` (the WSGI app around moto: who is faulted, and each call sent to its service's
faults), `dynamodb.py`, `sqs.py`, `s3.py`, `services.py` (EventBridge, Secrets Manager and
CloudWatch) (each service's faults and its errors as it answers
them), `replicas.py` (the lagging replicas behind `dynamodb.stale_ms`), `wsgi.py` (requests and
answers between the injector and moto). A new fault: its name in `config.FAULT_NAMES`, its
injection in its service's module, its line above, and a test in `tests/local_stack/aws_faults/`.
"""
