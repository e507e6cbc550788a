"""Logger, metrics and tracer shared by every function (Powertools).

Logs go to stderr: on Lambda both streams reach CloudWatch, and on the local stack stdout is
kept for the one line that tells the user where the stack is. Nothing here ever logs a key or a
request body: only ids.
"""

from __future__ import annotations

import sys

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="freeinference-batch", stream=sys.stderr)
metrics = Metrics(namespace="FreeInferenceBatch", service="freeinference-batch")
tracer = Tracer(service="freeinference-batch")

