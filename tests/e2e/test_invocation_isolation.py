"""Concurrent API invocations never read each other's event (key, query string, body).

Lambda gives an execution environment one event at a time; the Powertools resolver keeps the
event it serves in module state (`app.current_event`), so invocations sharing a process would
read another request's query string, headers or body. The local stack runs each invocation in an
execution environment of its own; this drives two accounts' requests side by side and checks
that every answer is its own request's.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

from conftest import Api

DURATION_SECONDS = 15.0
THREADS_PER_ACCOUNT = 6
# Each thread lists with its own limit, and reads results with limit=1000 (the results' maximum,
# over the list's 100): an answer computed from another request's query string shows in its page
# length, or as a 400 "limit must be from 1 to 100".
LIST_LIMITS = {"alpha": (2, 3, 4, 5, 6, 7), "beta": (8, 9, 10, 11, 12, 13)}
RESULTS_LIMIT = 1000


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    found: threading.Event = field(default_factory=threading.Event)

    def count(self) -> None:
        with self.lock:
            self.requests += 1

    def add(self, problem: str) -> None:
        with self.lock:
            self.problems.append(problem)
        self.found.set()


def _client(api: Api, account: str, limit: int, stop: threading.Event, findings: Findings) -> None:
    mine: set[str] = set()
    prefix = f"{account}-"
    while not stop.is_set():
        token = uuid.uuid4().hex
        metadata = {"account": account, "token": token}
        created = api.create_batch(
            [{"custom_id": prefix + token,
              "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": f"Hi {token}"}]}}],
            metadata=metadata,
        )  # fmt: skip
        findings.count()
        if created.status_code != 200:
            findings.add(f"{account} create: {created.status_code} {created.text[:200]}")
            continue
        batch = created.json()
        if batch.get("metadata") != metadata:
            findings.add(f"{account} create answered another body's batch: {batch.get('metadata')} != {metadata}")
            continue
        mine.add(batch["id"])

        read = api.get(f"/batches/{batch['id']}")
        findings.count()
        if read.status_code != 200 or read.json().get("metadata") != metadata:
            findings.add(f"{account} get {batch['id']}: {read.status_code} {read.text[:200]}")

        results = api.get(f"/batches/{batch['id']}/results", params={"limit": RESULTS_LIMIT})
        findings.count()
        if results.status_code != 200:
            findings.add(f"{account} results limit={RESULTS_LIMIT}: {results.status_code} {results.text[:200]}")
        else:
            strangers = [line["custom_id"] for line in results.json()["data"] if line["custom_id"] != prefix + token]
            if strangers:
                findings.add(f"{account} results of {batch['id']} hold other requests: {strangers[:3]}")

        page = api.get("/batches", params={"limit": limit})
        findings.count()
        if page.status_code != 200:
            findings.add(f"{account} list limit={limit}: {page.status_code} {page.text[:200]}")
            continue
        body = page.json()
        listed = body["data"]
        if len(listed) > limit or (body["has_more"] and len(listed) != limit):
            findings.add(f"{account} list limit={limit}: {len(listed)} batches, has_more={body['has_more']}")
        others = [item["metadata"] for item in listed if (item.get("metadata") or {}).get("account") != account]
        if others:
            findings.add(f"{account} list shows batches of another account: {others[:3]}")


def test_concurrent_requests_of_two_accounts_never_mix_keys_query_strings_or_bodies(start_stack, tmp_path):
    # Given a stack with room for many unfinished batches, and two (internal) accounts with a key each
    stack = start_stack(tmp_path, BATCH_MAX_UNFINISHED="10000")
    keys = {account: stack.create_key(account, tier="internal") for account in LIST_LIMITS}
    findings = Findings()
    stop = threading.Event()
    # When each account's threads create batches (each with its own metadata), read each one and
    # its results (limit=1000), and list their batches (each thread its own limit), side by side
    threads = [
        threading.Thread(target=_client, args=(Api(stack.base_url, keys[account]), account, limit, stop, findings),
                         daemon=True)
        for account, limits in LIST_LIMITS.items()
        for limit in limits[:THREADS_PER_ACCOUNT]
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    findings.found.wait(DURATION_SECONDS)  # the whole time, unless an answer is mixed before
    stop.set()
    for thread in threads:
        thread.join(60)
    # Then every answer was its own request's: no 400 or 401, each account saw only its own
    # batches, each page had its own limit's length, each create stored its own body
    assert not findings.problems, f"{len(findings.problems)} mixed answers, e.g.:\n" + "\n".join(findings.problems[:10])
    # (and the requests did run side by side, many of them)
    assert findings.requests >= 100, findings.requests
