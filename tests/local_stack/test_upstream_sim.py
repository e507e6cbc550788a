"""The simulated upstream: deterministic replies, real usage counts, directives, concurrency."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import requests
from freeinference_batch_local.upstream_sim import UpstreamSimulator


@pytest.fixture
def sim():
    with UpstreamSimulator() as simulator:
        yield simulator


def chat(sim, content, *, model="glm-5.3-flash", request_id=None, timeout=10, **extra):
    headers = {"X-FreeInference-Request-Id": request_id} if request_id else {}
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return requests.post(f"{sim.base_url}/chat/completions", json=body, headers=headers, timeout=timeout)


def test_start_returns_v1_base_url(sim):
    assert sim.base_url.startswith("http://127.0.0.1:")
    assert sim.base_url.endswith("/v1")
    assert sim.port > 0


def test_reply_is_a_chat_completion_with_real_usage(sim):
    # Given a system and a user message of known word counts
    messages = [
        {"role": "system", "content": "You are terse."},  # 3 words
        {"role": "user", "content": "Say hello to the world"},  # 5 words
    ]
    # When
    answer = requests.post(f"{sim.base_url}/chat/completions", json={"model": "m", "messages": messages})
    # Then
    assert answer.status_code == 200
    body = answer.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == "m"
    assert isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    text = choice["message"]["content"]
    assert text.startswith("Simulated reply ")
    assert text.endswith("Say hello to the world")
    usage = body["usage"]
    assert usage["prompt_tokens"] == (3 + 3) + (5 + 3)
    assert usage["completion_tokens"] == len(text.split())
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_empty_message_counts_at_least_one_word(sim):
    answer = chat(sim, "")
    assert answer.json()["usage"]["prompt_tokens"] == 1 + 3


def test_list_of_parts_content_is_read(sim):
    content = [{"type": "text", "text": "alpha beta"}, {"type": "image_url", "image_url": {"url": "x"}}]
    answer = chat(sim, content)
    body = answer.json()
    assert body["choices"][0]["message"]["content"].endswith("alpha beta")
    assert body["usage"]["prompt_tokens"] == 2 + 3


def test_reply_is_deterministic(sim):
    first = chat(sim, "the same question").json()["choices"][0]["message"]["content"]
    second = chat(sim, "the same question").json()["choices"][0]["message"]["content"]
    other_model = chat(sim, "the same question", model="qwen3.6-35b").json()
    other_text = other_model["choices"][0]["message"]["content"]
    assert first == second
    assert other_text != first


def test_max_tokens_truncates_with_finish_reason_length(sim):
    body = chat(sim, "one two three four five six", max_tokens=4).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["message"]["content"].split()) == 4
    assert body["usage"]["completion_tokens"] == 4


def test_path_without_v1_is_accepted(sim):
    root = sim.base_url.removesuffix("/v1")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert requests.post(f"{root}/chat/completions", json=body).status_code == 200


def test_unknown_path_is_404(sim):
    answer = requests.post(f"{sim.base_url}/completions", json={"model": "m"})
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": "hi"},
    ],
)
def test_invalid_body_is_400_with_openai_error(sim, body):
    answer = requests.post(f"{sim.base_url}/chat/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["type"] == "invalid_request_error"


def test_malformed_json_is_400(sim):
    answer = requests.post(f"{sim.base_url}/chat/completions", data=b"{not json")
    assert answer.status_code == 400


def test_status_directive_answers_every_attempt(sim):
    for _ in range(3):
        answer = chat(sim, "please [sim:status=503] fail", request_id="b:1")
        assert answer.status_code == 503
        assert answer.json()["error"]["type"] == "server_error"
    assert sim.attempts_by_request["b:1"] == 3


def test_status_until_directive_answers_its_status_until_the_gate_opens(sim):
    # Given a request that fails with 400 until gate "fixed" opens
    assert [chat(sim, "[sim:status=400 until=fixed] hi", request_id="b:2").status_code for _ in range(2)] == [400, 400]
    # When the test opens the gate, then it (and any other request naming it) succeeds from now on
    sim.open_gate("fixed")
    assert chat(sim, "[sim:status=400 until=fixed] hi", request_id="b:2").status_code == 200
    assert chat(sim, "[sim:status=400 until=fixed] hi", request_id="b:3").status_code == 200
    # And another gate's request still fails
    assert chat(sim, "[sim:status=503 until=other] hi", request_id="b:4").status_code == 503


def test_fail_directive_fails_first_n_attempts_per_request_id(sim):
    codes = [chat(sim, "[sim:fail=429*2] hello", request_id="batch_x:7").status_code for _ in range(3)]
    assert codes == [429, 429, 200]
    # Another request with the same text has its own counter.
    assert chat(sim, "[sim:fail=429*2] hello", request_id="batch_x:8").status_code == 429
    assert sim.attempts_by_request["batch_x:7"] == 3
    assert sim.attempts_by_request["batch_x:8"] == 1


def test_fail_directive_without_header_counts_by_body(sim):
    codes = [chat(sim, "[sim:fail=500*1] same body").status_code for _ in range(2)]
    assert codes == [500, 200]


def test_directive_in_list_content_and_other_message(sim):
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "[sim:status=400]"}]},
        {"role": "user", "content": "hi"},
    ]
    answer = requests.post(f"{sim.base_url}/chat/completions", json={"model": "m", "messages": messages})
    assert answer.status_code == 400


def test_directives_are_not_echoed(sim):
    text = chat(sim, "[sim:latency=0.01] plain words").json()["choices"][0]["message"]["content"]
    assert "sim:" not in text
    assert text.endswith("plain words")


def test_latency_directive_delays_the_answer(sim):
    started = time.monotonic()
    assert chat(sim, "[sim:latency=0.3] slow").status_code == 200
    assert time.monotonic() - started >= 0.3


def test_many_concurrent_requests_are_served_in_parallel(sim):
    def one(i: int) -> int:
        return chat(sim, f"[sim:latency=0.5] request {i}", request_id=f"c:{i}").status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        codes = list(pool.map(one, range(50)))
    assert codes == [200] * 50
    assert sim.total_requests == 50
    # Sequential handling would have max_concurrent == 1.
    assert sim.max_concurrent >= 25


def test_gate_holds_every_request_until_the_test_opens_it(sim):
    # Given three requests held by one gate and one by another
    with ThreadPoolExecutor(4) as pool:
        held = [pool.submit(chat, sim, f"[sim:gate=all] q{n}", timeout=10) for n in range(3)]
        other = pool.submit(chat, sim, "[sim:gate=other] q", timeout=10)
        deadline = time.monotonic() + 5
        while sim.concurrent < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Then all four are in flight at once, none answered
        assert sim.concurrent == 4 and not any(future.done() for future in [*held, other])
        # When the first gate opens, its three answer and the other stays held
        sim.open_gate("all")
        assert [future.result(timeout=5).status_code for future in held] == [200, 200, 200]
        assert not other.done()
        # And a request that comes after its gate opened answers at once
        assert chat(sim, "[sim:gate=all] late", timeout=5).status_code == 200
        sim.open_gate("other")
        assert other.result(timeout=5).status_code == 200


def test_hang_does_not_block_other_requests(sim):
    with pytest.raises(requests.exceptions.Timeout):
        chat(sim, "[sim:hang]", timeout=0.5)
    started = time.monotonic()
    assert chat(sim, "quick", timeout=5).status_code == 200
    assert time.monotonic() - started < 2


def test_hang_is_released_when_client_disconnects(sim):
    with pytest.raises(requests.exceptions.Timeout):
        chat(sim, "[sim:hang]", timeout=0.3)
    # requests closes the timed-out connection; the held handler notices and lets go.
    deadline = time.monotonic() + 3
    while sim.concurrent and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.concurrent == 0


def test_stop_releases_hanging_requests_quickly():
    simulator = UpstreamSimulator()
    simulator.start()
    errors: list[BaseException] = []

    def hang() -> None:
        try:
            chat(simulator, "[sim:hang]", timeout=30)
        except requests.RequestException as error:
            errors.append(error)

    client = threading.Thread(target=hang)
    client.start()
    deadline = time.monotonic() + 3
    while simulator.concurrent == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    simulator.stop()
    client.join(timeout=5)
    assert not client.is_alive()
    assert time.monotonic() - started < 3
    assert errors  # the held request got no answer


def test_keep_alive_serves_several_requests_on_one_connection(sim):
    parts = urlsplit(sim.base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    try:
        for _ in range(3):
            connection.request(
                "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["object"] == "chat.completion"
        assert len(sim._connections) == 1
    finally:
        connection.close()


def test_stop_is_idempotent_and_closes_idle_connections():
    simulator = UpstreamSimulator()
    simulator.start()
    session = requests.Session()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert session.post(f"{simulator.base_url}/chat/completions", json=body).status_code == 200
    simulator.stop()
    simulator.stop()
    deadline = time.monotonic() + 3
    while simulator._connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not simulator._connections
