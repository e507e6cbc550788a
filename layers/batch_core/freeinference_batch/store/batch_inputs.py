"""A batch's input chunks, `BATCH#<id>` / `IN#<n>`: the batch's requests as create stored them
(their packed form is input_chunks.py's), in the item, or in the payload bucket when a single
request is too big for one. Written once at create, never changed: warm workers cache them."""

from __future__ import annotations

from collections.abc import Callable

from freeinference_batch.store import caches, input_chunks, objects
from freeinference_batch.store.batch_keys import batch_pk, chunk_sk
from freeinference_batch.store.dynamo import get_written_once, key, to_item


class InputChunks:
    """The batch table's `IN#` items (a part of `BatchTable`)."""

    name: str
    bucket: str

    def chunk_item(self, batch_id: str, number: int, packed: bytes, ttl: int) -> dict:
        return to_item({"pk": batch_pk(batch_id), "sk": chunk_sk(number), "data": packed, "ttl": ttl})

    def chunk_item_in_s3(self, batch_id: str, number: int, packed: bytes, ttl: int) -> dict:
        s3_key = f"{batch_id}/input/{number:05d}.json.z"
        objects.put(self.bucket, s3_key, packed)
        return to_item({"pk": batch_pk(batch_id), "sk": chunk_sk(number), "s3_key": s3_key, "ttl": ttl})

    def get_chunk(self, batch_id: str, number: int,
                  holding: Callable[[int], None] = lambda size: None) -> input_chunks.InputRun:
        """The requests of one input chunk. Cached: chunks never change. `holding(size)` is told
        the size of a chunk's one body (a large body is alone in its chunk) before it is read or
        decompressed: a worker takes its memory permit for a large one then."""
        cached = caches.chunks.get((batch_id, number))
        if cached is not None:
            return cached
        data = self._chunk_data(batch_id, number, holding)
        lines = input_chunks.header(data)
        if len(lines) == 1:
            holding(int(lines[0][2]))
        run = input_chunks.unpack(data)
        caches.chunks.put((batch_id, number), run)
        return run

    def get_custom_ids(self, batch_id: str, number: int) -> list[str]:
        """The custom ids of one input chunk's requests (its bodies are not decompressed)."""
        cached = caches.chunks.get((batch_id, number))
        if cached is not None:
            return cached.custom_ids
        return input_chunks.unpack_custom_ids(self._chunk_data(batch_id, number))

    def _chunk_data(self, batch_id: str, number: int,
                    holding: Callable[[int], None] = lambda size: None) -> bytes:
        item = get_written_once(self.name, key(batch_pk(batch_id), chunk_sk(number)))
        if item is None:
            raise LookupError(f"input chunk {number} of {batch_id} is missing")
        if "data" in item:
            return item["data"]
        stored = objects.get(self.bucket, item["s3_key"])
        holding(stored.size)  # one request, over the item limit even compressed
        return stored.read()
