"""The user commands of `freeinference-batch`: submit, status, list, cancel, delete, retry,
results, and `webhooks add/list/delete/test` (the account's webhook endpoints).

They speak OpenAI's batch files: `submit` takes an OpenAI batch input file (JSONL), checks it
with the server's own rules, splits it into as many batches as the limits require and records
them in a manifest (so an interrupted submit resumes without creating anything twice);
`results` writes OpenAI's output-file format, in submission order across the job's batches.

The API key comes from FREEINFERENCE_API_KEY, the base URL from FREEINFERENCE_BASE_URL (default
https://freeinference.org/v1). `status`, `cancel`, `delete` and `results` take a batch id or a
manifest file; `retry` a batch id, and `results --merged` the latest retry of a batch.

This module registers them; each lives with its kind: submit.py, results.py (with the waiting
that `submit --wait` shares), batches.py (status, list, cancel, delete, retry), webhooks.py; common.py
holds what they share (the client, the error line, the batch-id-or-manifest argument).
"""

from __future__ import annotations

import click

from freeinference_batch_client.cli.batches import cancel, delete, list_batches, retry, status
from freeinference_batch_client.cli.results import results
from freeinference_batch_client.cli.submit import submit
from freeinference_batch_client.cli.webhooks import webhooks


def register(main: click.Group) -> None:
    """Add the user commands to the `freeinference-batch` group."""
    for command in (submit, status, list_batches, cancel, delete, retry, results, webhooks):
        main.add_command(command)
