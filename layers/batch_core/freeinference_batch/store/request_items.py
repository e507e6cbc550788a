"""A batch's request items, `BATCH#<id>` / `REQ#000000042`: written when a request first runs
(store/runs.py has a run's writes), they hold its status, attempts, last error and response
(compressed in the item; its body in the payload bucket when large). A request that never ran
has no item: it reads as queued."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

from freeinference_batch.core import aws
from freeinference_batch.core.schemas import RequestStatus
from freeinference_batch.store import objects
from freeinference_batch.store.batch_keys import batch_pk, request_key
from freeinference_batch.store.dynamo import apply_update, batch_get, from_item, query_all, update_element, values

# Responses whose JSON is larger than this go to S3 (DynamoDB items stop at 400 KB). Smaller ones
# are stored compressed in the request's item, so none of those can outgrow a results page alone.
INLINE_RESPONSE_LIMIT = 300_000
# How long a presigned URL of a stored response is valid.
RESPONSE_URL_SECONDS = 3600


class RequestItems:
    """The batch table's `REQ#` items (a part of `BatchTable`)."""

    name: str
    bucket: str

    def get_request(self, batch_id: str, position: int) -> dict | None:
        answer = aws.dynamodb().get_item(TableName=self.name, Key=request_key(batch_id, position),
                                         ConsistentRead=True)
        return from_item(answer.get("Item"))

    def iter_requests(self, batch_id: str, first: int, last: int) -> Iterator[tuple[int, dict]]:
        """(position, state) of the requests first..last (inclusive) that have a state, in position
        order, read a Query page (1 MB) at a time as the caller goes: a results page that stops at
        its byte budget reads no further. Consistent: a page read after the batch's (consistent)
        status must not show a request as running that the status counts as finished."""
        for item in query_all(
            TableName=self.name,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
            ExpressionAttributeValues=values(pk=batch_pk(batch_id), lo=f"REQ#{first:09d}", hi=f"REQ#{last:09d}"),
            ConsistentRead=True,
        ):
            yield int(item["sk"][4:]), item

    def request_statuses(self, batch_id: str, total: int) -> dict[int, str]:
        """The status of each of the batch's requests that has an item, by position: what a retry
        chooses its requests by. Only the status comes back, never the responses that make the
        items large (DynamoDB still bills the whole items read), so the answer of a batch of
        50,000 stays a few MB."""
        if total <= 0:
            return {}
        return {int(item["sk"][4:]): item["status"] for item in query_all(
            TableName=self.name,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
            ExpressionAttributeValues=values(pk=batch_pk(batch_id), lo="REQ#000000000", hi=f"REQ#{total - 1:09d}"),
            ProjectionExpression="sk, #status", ExpressionAttributeNames={"#status": "status"},
            ConsistentRead=True,
        )}

    def get_outcomes(self, batch_id: str, positions: list[int]) -> dict[int, tuple[str, int, float]]:
        """(status, cost, finished_at) of those of the given requests that have a state: what
        counting them needs (the day a cost is charged to is the day its request finished), without
        their responses. finished_at is 0 for a request not settled."""
        found = batch_get({self.name: {"Keys": [request_key(batch_id, p) for p in positions], "ConsistentRead": True,
                                       "ProjectionExpression": "sk, #status, cost_nano, finished_at",
                                       "ExpressionAttributeNames": {"#status": "status"}}})
        return {int(item["sk"][4:]): (item["status"], int(item.get("cost_nano", 0)), float(item.get("finished_at", 0)))
                for item in found[self.name]}

    def set_request_lease(self, batch_id: str, position: int, until: float) -> bool:
        """A queued request's lease, renewed while its chain waits (so the sweep sends no
        duplicate of its message): only while it is queued."""
        return apply_update(update_element(self.name, request_key(batch_id, position), "SET lease_until = :until",
                                           "#status = :queued", names={"#status": "status"}, until=until,
                                           queued=RequestStatus.QUEUED))

    # ---- responses

    def load_response(self, state: dict) -> dict | None:
        if "response_z" in state:
            return json.loads(zlib.decompress(state["response_z"]))
        if "response_s3_key" in state:
            body = objects.get(self.bucket, state["response_s3_key"]).read()
            return {"status_code": state["response_status"], "request_id": state["response_request_id"],
                    "body": json.loads(gzip.decompress(body))}
        return None

    def response_attributes(self, batch_id: str, position: int, token: str, response: dict) -> dict[str, Any]:
        """The attributes that store a response on its request item: compressed inline when small,
        else its body in S3 (status and request id stay in the item).

        Stored as bytes, never as a DynamoDB map: a completion's JSON may hold empty object keys,
        which DynamoDB refuses as attribute names. The S3 key names the run's claim, so a run that
        lost its claim (and whose settle will fail) never overwrites the winner's body; its own
        object is left for the purge. An S3 body is gzip JSON with a matching Content-Encoding, so
        a presigned URL (`response_url`) serves it as it is."""
        encoded = json.dumps(response, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        if len(encoded) <= INLINE_RESPONSE_LIMIT:
            return {"response_z": zlib.compress(encoded, 6)}
        body = json.dumps(response["body"], separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        s3_key = f"{batch_id}/responses/{position:09d}/{token}.json.gz"
        objects.put(self.bucket, s3_key, gzip.compress(body, 6), ContentType="application/json",
                    ContentEncoding="gzip")
        return {"response_s3_key": s3_key, "response_status": response["status_code"],
                "response_request_id": response["request_id"]}

    def response_url(self, state: dict, expires_in: int = RESPONSE_URL_SECONDS) -> str:
        """A presigned GET of a response body stored in S3 (for a result too big for any page of
        results): S3 answers it as JSON with Content-Encoding gzip, which HTTP clients undo."""
        return objects.presigned_get_url(self.bucket, state["response_s3_key"], expires_in,
                                         ResponseContentType="application/json", ResponseContentEncoding="gzip")
