"""How a batch's requests are packed into input runs: a large body alone in its run."""

from __future__ import annotations

import os

from freeinference_batch.core.schemas import CheckedRequest
from freeinference_batch.store.input_chunks import ALONE_BYTES, RUN_TARGET_BYTES, header, pack, unpack


def _request(n: int, size: int) -> CheckedRequest:
    # Random hex does not compress much, as large bodies of real prompts may not.
    return CheckedRequest(f"q-{n}", "glm-5.3-flash", os.urandom(size // 2).hex().encode())


def _runs(requests: list[CheckedRequest]) -> list[list[str]]:
    return [[line[0] for line in header(run.data)] for run in pack(requests)]


def test_a_large_body_is_alone_in_its_run_and_its_neighbours_keep_theirs() -> None:
    small = [_request(n, 1024) for n in range(6)]
    large = _request(99, ALONE_BYTES + 2)
    runs = _runs([*small[:3], large, *small[3:]])
    assert runs == [["q-0", "q-1", "q-2"], ["q-99"], ["q-3", "q-4", "q-5"]]


def test_every_body_comes_back_whole_in_order() -> None:
    requests = [_request(n, size) for n, size in enumerate([100, ALONE_BYTES + 2, 5000, 3 * ALONE_BYTES, 10, 20])]
    bodies = []
    for run in pack(requests):
        unpacked = unpack(run.data)
        bodies += [unpacked.body(i) for i in range(len(unpacked.custom_ids))]
    assert bodies == [r.body for r in requests]


def test_small_bodies_share_runs_of_about_the_target_size() -> None:
    requests = [_request(n, 10 * 1024) for n in range(100)]  # 1,000 KiB in all
    runs = _runs(requests)
    assert 3 <= len(runs) <= 5
    assert sum(len(run) for run in runs) == 100
    # A run of small bodies stays under the target plus one body: no run holds a large one
    assert all(len(run) * 10 * 1024 <= RUN_TARGET_BYTES + ALONE_BYTES for run in runs)
