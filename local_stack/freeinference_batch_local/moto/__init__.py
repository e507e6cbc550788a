"""The local stack's AWS: the moto server (`server.py`, one request at a time; `process.py`, it in
a child process) and the stack's patches to moto: `transactions.py`, `serialization.py` and
`expressions.py` (moto's cost made what it would be on DynamoDB), `limits.py` (what DynamoDB and
SQS refuse and moto does not)."""
