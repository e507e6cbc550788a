"""The spec's "Python example", its code unchanged except the base URL, against the local stack.

It runs as a script of its own (with FREEINFERENCE_API_KEY set, as the spec says), waits for the
batch and must print every result: one line per prompt, the custom_id first. The code stays as the
spec has it, its `time.sleep(30)` included; the script's interpreter shortens each sleep to a
second (a `sitecustomize` beside it), so that the wait costs CI seconds, not half a minute.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SPEC = Path(__file__).resolve().parents[2].parent / "shared" / "spec" / "batch-inference.md"
SPEC_API_LINE = 'API = "https://freeinference.org/v1"'

# Copied from the spec's "Python example" (the test below checks it still matches the spec).
EXAMPLE = """\
import os
import time

import requests

API = "https://freeinference.org/v1"
session = requests.Session()
session.headers["Authorization"] = f"Bearer {os.environ['FREEINFERENCE_API_KEY']}"


def call(method, path, **kwargs):
    response = session.request(method, API + path, timeout=120, **kwargs)
    response.raise_for_status()
    return response.json()


prompts = ["Summarize the plot of Hamlet in two sentences.", "Name three prime numbers."]
batch = call(
    "POST",
    "/batches",
    json={
        "requests": [
            {
                "custom_id": f"q-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "glm-5.3-flash",
                    "messages": [{"role": "user", "content": prompt}],
                },
            }
            for i, prompt in enumerate(prompts)
        ]
    },
)

# Wait for a final status.
while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(30)
    batch = call("GET", f"/batches/{batch['id']}")

# Page through every result.
results, after = [], None
while True:
    params = {"limit": 1000}
    if after:
        params["after"] = after
    page = call("GET", f"/batches/{batch['id']}/results", params=params)
    results.extend(page["data"])
    if not page["has_more"]:
        break
    after = page["last_id"]

for result in results:
    if result["status"] == "completed":
        print(result["custom_id"], result["response"]["body"]["choices"][0]["message"]["content"])
    else:
        print(result["custom_id"], result["status"], result["error"])
"""
PROMPTS = ["Summarize the plot of Hamlet in two sentences.", "Name three prime numbers."]


def spec_example() -> str | None:
    """The code block under the spec's "## Python example" heading, if the spec is at hand."""
    if not SPEC.is_file():
        return None
    text = SPEC.read_text(encoding="utf-8")
    section = text.split("## Python example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "the spec's Python example has no python code block"
    return found.group(1)


def test_embedded_example_is_the_spec_s():
    spec = spec_example()
    if spec is None:
        pytest.skip(f"the spec is not at {SPEC}")
    assert spec == EXAMPLE
    assert EXAMPLE.count(SPEC_API_LINE) == 1


def test_spec_python_example_runs_against_the_local_stack_and_prints_every_result(stack, tmp_path):
    # Given the example with only its base URL changed, and a key of an internal account of its own
    script = tmp_path / "example.py"
    script.write_text(EXAMPLE.replace(SPEC_API_LINE, f"API = {stack.base_url!r}"), encoding="utf-8")
    assert script.read_text().replace(f"API = {stack.base_url!r}", SPEC_API_LINE) == EXAMPLE
    key = stack.create_key("e2e-spec-example", tier="internal")
    (tmp_path / "sitecustomize.py").write_text(
        "import time\n_sleep = time.sleep\ntime.sleep = lambda seconds: _sleep(min(seconds, 1.0))\n")
    env = {**os.environ, "FREEINFERENCE_API_KEY": key,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    # When it runs
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=150)
    # Then it exits 0 and prints one line per prompt, in order, each a completed result
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == len(PROMPTS), done.stdout
    for index, line in enumerate(lines):
        custom_id, _, content = line.partition(" ")
        assert custom_id == f"q-{index}", line
        assert content and not content.startswith(("failed", "expired", "cancelled")), line
    # And what it printed is the batch's results as the API serves them
    api = stack.api(key)
    batches = api.get("/batches").json()["data"]
    assert len(batches) == 1 and batches[0]["status"] == "completed", batches
    assert batches[0]["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    results = api.get(f"/batches/{batches[0]['id']}/results").json()["data"]
    expected = [f"{r['custom_id']} {r['response']['body']['choices'][0]['message']['content']}" for r in results]
    assert lines == expected
