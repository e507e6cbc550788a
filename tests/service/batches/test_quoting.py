"""How messages quote a custom_id (and a model id): the spec's `(custom_id 'q-2')`, the id in
single quotes as given, only control characters escaped, ids over 64 characters cut to 61 plus
`...`; not Python's repr (double quotes around an id holding `'`, escapes, another cut)."""

from __future__ import annotations

import pytest
from freeinference_batch.batches import validation
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch.core.errors import BadRequest


def refusal(requests: list[dict]) -> str:
    with pytest.raises(BadRequest) as caught:
        validation.validate_requests(requests, load_catalog(), "internal", 100)
    return caught.value.message


def request(custom_id: str, model: str = "no-such-model") -> dict:
    return {"custom_id": custom_id, "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}}


@pytest.mark.parametrize(("custom_id", "shown"), [
    ("q-2", "'q-2'"),
    ("it's", "'it's'"),
    ('say "hi"', "'say \"hi\"'"),
    ("back\\slash", "'back\\slash'"),
    ("caf\u00e9 \u6f22\u5b57", "'caf\u00e9 \u6f22\u5b57'"),
    ("a\nb", "'a\\nb'"),
    ("a\rb\tc", "'a\\rb\\tc'"),
    ("nul\x00", "'nul\\u0000'"),
    ("del\x7f", "'del\\u007f'"),
    ("c1\x85", "'c1\\u0085'"),
    ("x" * 64, "'" + "x" * 64 + "'"),
    ("x" * 65, "'" + "x" * 61 + "...'"),
    ("\n" * 70, "'" + "\\n" * 61 + "...'"),
])
def test_a_custom_id_is_quoted_as_the_spec_writes_it(custom_id, shown):
    assert validation.quote(custom_id) == shown
    assert refusal([request(custom_id)]) == f"requests[0] (custom_id {shown}): Model 'no-such-model' not found"


def test_a_repeated_custom_id_is_quoted_the_same_way():
    message = refusal([request("it's", "glm-5.3-flash"), request("it's", "glm-5.3-flash")])
    assert message == ("requests[1] (custom_id 'it's'): custom_id 'it's' repeats requests[0]; "
                       "custom_id must be unique within the batch")


def test_a_model_id_is_quoted_the_same_way():
    assert refusal([request("q-1", model="it's\n")]) == "requests[0] (custom_id 'q-1'): Model 'it's\\n' not found"
    assert refusal([request("q-1", model="auto-\"x\"")]) == (
        "requests[0] (custom_id 'q-1'): Auto model 'auto-\"x\"' cannot be used in a batch; name a model ID")
