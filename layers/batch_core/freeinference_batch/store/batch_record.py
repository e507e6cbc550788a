"""The batch record: the `BATCH#<id>` / `META` item as the code reads it (batch_status.py writes its
status, runs.py its counts).

Written whole at create; later writes only set, add to or remove attributes, so every item that
exists has the create-time fields, and those are required: an item without them is not a batch
the code can serve, and reading it fails where it is read, naming the field. The rest are written
later or may be removed, and default to what their absence means.

The item's key and index attributes (`pk`, `sk`, `created_key`, `open_shard`, `purge_shard`) are
how the table finds a batch, not what a batch is: no field. Attributes this model does not name
are ignored, so items written before a field existed, or by code that adds one, still load.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from freeinference_batch.core.schemas import BatchStatus, Waiting


class BatchRecord(BaseModel):
    # Frozen: a record is the item as read at one moment; a change is a write, and the writer's
    # answer (batch_status.mark_failing, start_cancelling) is the new record.
    model_config = ConfigDict(extra="ignore", frozen=True)

    # ---- written at create, never removed ----------------------------------------------------
    id: str
    account_id: str
    key_hash: str
    status: BatchStatus
    created_at: int
    expires_at: int
    window_seconds: int
    total: int
    # The result id of position p is `batch_req_<id_base + p>` (ids are unique across batches).
    id_base: int
    # The first position of each input chunk (`IN#<n>`), ascending.
    chunk_starts: list[int]
    # Each model's lane width: how many chains it has, fixed at create.
    lane_widths: dict[str, int]
    ttl: int

    # ---- written at create, removed when the batch is deleted ---------------------------------
    # The owner index's key; `account_id` is the same account and stays.
    owner: str | None = None

    # ---- counters: written 0 at create, then added to (absent reads as 0) ----------------------
    completed: int = 0
    failed: int = 0
    running: int = 0  # chains a run has, not requests (store/runs.py)
    cost_nano: int = 0

    metadata: dict[str, str] | None = None
    # Written at create on a batch made by a retry (the parent's id); absent on every other batch.
    retry_of: str | None = None
    # Written at create on a batch made from a file (OpenAI's form), and on a retry's child of one.
    input_file_id: str | None = None
    # A file batch whose lines are not yet checked and stored: written at create, removed by the
    # one write that stores its requests (`batch_status.checked`) or fails it (`finish` with
    # errors). While set, `total` is 0 and it has no requests: nothing may complete it.
    unchecked: bool = False
    # When the sweep last sent an unchecked batch's `validate` job again (its first was create's).
    check_sent_at: int | None = None
    # Why its file failed the checks (OpenAI's `{"object": "list", "data": [...]}`), set with failed.
    errors: dict[str, Any] | None = None
    # A batch created from a file (`input_file_id`) ends through its output and error files
    # (batches/output_files.py): `ending` is the final status it takes once they are written, set
    # (with `ending_at`) by the write that stops it (batch_status.end_with_files) and removed by
    # the final one, which also sets the files' ids (absent: none, as for an inline batch).
    ending: BatchStatus | None = None
    ending_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    # Set when the owner lost the right to run it: no request starts, and the batch fails once
    # none runs; the same map then becomes `error`.
    failing: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    # Why none of its unstarted requests can start, set by a chain that parks for a reason outside
    # the batch while none of it runs (batch_status.wait); removed by the next start, a final
    # status, or failing. Absent: not waiting.
    waiting: Waiting | None = None

    # ---- timestamps (whole seconds), each written once when its step happens -------------------
    in_progress_at: int | None = None
    cancelling_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelled_at: int | None = None
    finished_at: int | None = None
    deleted_at: int | None = None
    # When a final or deleted batch stops being visible, and the purge may delete it.
    purge_at: int | None = None
