"""Execution environments (local_stack/freeinference_batch_local/environments.py): a process per
environment, one event at a time, a pool per function up to its concurrency, Lambda's timeout and
error results, and schedule ticks that overlap in environments of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pytest
from freeinference_batch_local.api_gateway.integration import invoke_integration
from freeinference_batch_local.cloudformation.template import load_template
from freeinference_batch_local.environments import EnvironmentPool, ExecutionEnvironment, FunctionError, is_throttle
from freeinference_batch_local.handlers import (
    LOCAL_UNRESERVED_CONCURRENCY,
    FunctionSpec,
    functions_from_template,
    repo_root,
)
from freeinference_batch_local.moto.server import MotoServer
from freeinference_batch_local.triggers.dynamodb_stream import StreamPoller
from freeinference_batch_local.triggers.schedules import ScheduleTimer

from tests.local_stack.waiting import wait_for

HANDLER = textwrap.dedent(
    '''
    import json
    import os
    import time
    from pathlib import Path

    calls = 0   # module state: one count per execution environment
    active = 0  # invocations running in this environment right now

    def handler(event, context):
        global calls, active
        calls += 1
        active += 1
        try:
            if event.get("detail-type") == "Scheduled Event":
                started = time.time()
                time.sleep(0.4)
                Path(os.environ["TEST_TICKS_DIR"], f"{os.getpid()}-{calls}").write_text(f"{started} {time.time()}")
            action = event.get("action")
            if action == "sleep":
                time.sleep(event["seconds"])
            elif action == "gather":  # wait (10 s at most) until `count` invocations have arrived
                Path(event["dir"], f"{os.getpid()}-{calls}").touch()
                deadline = time.monotonic() + 10
                while len(os.listdir(event["dir"])) < event["count"] and time.monotonic() < deadline:
                    time.sleep(0.01)
            elif action == "raise":
                raise ValueError("boom")
            elif action == "exit":
                os._exit(3)
            elif action == "crash":
                from freeinference_batch.worker.faults import SimulatedCrash
                raise SimulatedCrash("after_claim")
            elif action == "print":  # what Powertools metrics and logs do
                print("x" * 200_000, flush=True)
                print(json.dumps({"_aws": {"CloudWatchMetrics": []}}), flush=True)
            elif action == "send":
                from freeinference_batch.core import aws
                aws.sqs().send_message(QueueUrl=event["queue_url"], MessageBody="hello")
                time.sleep(event.get("then_sleep", 0))
            return {"pid": os.getpid(), "calls": calls, "active": active, "function_name": context.function_name,
                    "memory": context.memory_limit_in_mb, "remaining_ms": context.get_remaining_time_in_millis(),
                    "request_id": context.aws_request_id}
        finally:
            active -= 1
    '''
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (only its parent's wait() removes it), once all its threads have exited:
    # a killed process's main thread is a zombie before its other threads are gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z" or len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "fn"
    directory.mkdir()
    (directory / "app.py").write_text(HANDLER)
    (directory / "broken.py").write_text("raise RuntimeError('cannot start')\ndef handler(event, context): pass\n")
    return directory


@pytest.fixture
def make_pool(code_dir: Path):
    pools: list[EnvironmentPool] = []

    def make(cap: int | None = 2, timeout: float = 30, handler: str = "app.handler", reserved: int | None = None,
             **kwargs) -> EnvironmentPool:
        properties = {} if reserved is None else {"ReservedConcurrentExecutions": reserved}
        spec = FunctionSpec(logical_id="TestFunction", name="local-TestFunction", code_dir=code_dir,
                            handler_name=handler, timeout=timeout, memory_mb=256, properties=properties)
        pool = EnvironmentPool(spec, max_environments=cap, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def invoke_together(pool: EnvironmentPool, events: list[dict]) -> list[dict]:
    with ThreadPoolExecutor(max_workers=len(events)) as executor:
        return list(executor.map(pool.invoke, events))


def test_an_idle_environment_is_reused_and_keeps_its_module_state(make_pool):
    # Given a function's pool
    pool = make_pool(cap=3)
    # When it is invoked three times, one after the other
    answers = [pool.invoke({}) for _ in range(3)]
    # Then one environment (one cold start) served them all, its module state carried over
    assert {answer["pid"] for answer in answers} == {answers[0]["pid"]}
    assert [answer["calls"] for answer in answers] == [1, 2, 3]
    assert pool.stats()["cold_starts"] == 1 and pool.stats()["environments"] == 1


def test_concurrent_invocations_get_environments_of_their_own_up_to_the_cap(make_pool, tmp_path):
    # Given a pool of at most 2 environments
    pool = make_pool(cap=2)
    # When two invocations must run at the same time (each waits for the other to arrive)
    gather = {"action": "gather", "dir": str(tmp_path / "arrived"), "count": 2}
    Path(gather["dir"]).mkdir()
    together = invoke_together(pool, [gather, gather])
    # Then they ran in two environments, each with its own module state
    assert len({answer["pid"] for answer in together}) == 2
    assert [answer["calls"] for answer in together] == [1, 1]
    # When six invocations come at once
    many = invoke_together(pool, [{"action": "sleep", "seconds": 0.2}] * 6)
    # Then never more than 2 environments, each serving one event at a time
    assert {answer["pid"] for answer in many} == {answer["pid"] for answer in together}
    assert all(answer["active"] == 1 for answer in many)
    stats = pool.stats()
    assert stats["cold_starts"] == 2 and stats["environments"] == 2 and stats["max_busy"] == 2
    assert stats["invocations"] == 8 and stats["errors"] == 0


def test_an_invocation_beyond_the_reserved_concurrency_is_throttled_as_lambda_throttles_it(make_pool, tmp_path):
    # Given a function reserving 1 concurrent execution, busy with a long invocation
    pool = make_pool(cap=None, reserved=1)
    assert pool.max_environments == 1
    pool.prewarm()
    busy = threading.Thread(target=pool.invoke, args=({"action": "sleep", "seconds": 5},), daemon=True)
    busy.start()
    wait_for(lambda: pool.stats()["busy"] == 1, what="the first invocation to run")
    # When another invocation comes meanwhile
    started = time.monotonic()
    with pytest.raises(FunctionError) as raised:
        pool.invoke({})
    # Then Lambda's throttle answers it at once (it does not wait for the environment), and the
    # handler never ran
    assert time.monotonic() - started < 2 and busy.is_alive()
    assert raised.value.error_type == "TooManyRequestsException" and raised.value.error_message == "Rate Exceeded."
    assert is_throttle(raised.value)
    stats = pool.stats()
    assert stats["throttles"] == 1 and stats["invocations"] == 1 and stats["errors"] == 0
    # And API Gateway's Lambda integration answers the throttle as a failed integration: 500
    status, _, body = invoke_integration(pool, {}, None)
    assert (status, body) == (500, b'{"message":"Internal Server Error"}')
    busy.join(10)
    # And once the environment is free, the next invocation runs in it
    assert pool.invoke({})["calls"] == 2


def test_the_context_carries_the_function_and_the_deadline(make_pool):
    pool = make_pool(timeout=7)
    answer = pool.invoke({}, "req-123")
    assert answer["function_name"] == "local-TestFunction" and answer["memory"] == 256
    assert answer["request_id"] == "req-123"
    assert 5000 < answer["remaining_ms"] <= 7000


def test_a_handler_exception_is_lambdas_error_result_and_the_environment_serves_on(make_pool):
    pool = make_pool()
    first = pool.invoke({})
    with pytest.raises(FunctionError) as raised:
        pool.invoke({"action": "raise"})
    assert raised.value.error_type == "ValueError" and raised.value.error_message == "boom"
    assert raised.value.payload["errorType"] == "ValueError" and raised.value.stack_trace
    after = pool.invoke({})
    assert after["pid"] == first["pid"] and after["calls"] == 3


def test_a_simulated_crash_fails_the_invocation_without_a_new_process(make_pool):
    # The chaos tests crash hundreds of times: each crash must not cost a cold start.
    pool = make_pool()
    first = pool.invoke({})
    with pytest.raises(FunctionError) as raised:
        pool.invoke({"action": "crash"})
    assert raised.value.error_type == "SimulatedCrash" and raised.value.error_message == "after_claim"
    assert pool.invoke({})["pid"] == first["pid"]
    assert pool.stats()["cold_starts"] == 1


def test_a_timeout_fails_the_invocation_as_lambda_does_and_discards_the_environment(make_pool):
    # Given a function with a 1 s timeout
    pool = make_pool(timeout=1)
    pid = pool.invoke({})["pid"]
    # When an invocation runs longer
    started = time.monotonic()
    with pytest.raises(FunctionError) as raised:
        pool.invoke({"action": "sleep", "seconds": 30})
    # Then it fails at the timeout with Lambda's message, and that environment is gone
    assert time.monotonic() - started < 5
    assert raised.value.error_type == "Sandbox.Timedout"
    assert raised.value.error_message.endswith("Task timed out after 1.00 seconds")
    assert not alive(pid)
    # And the next invocation gets a new environment
    assert pool.invoke({})["pid"] != pid
    assert pool.stats()["timeouts"] == 1 and pool.stats()["environments"] == 1


def test_a_process_that_dies_mid_invocation_is_an_error_and_is_replaced(make_pool):
    pool = make_pool()
    pid = pool.invoke({})["pid"]
    with pytest.raises(FunctionError) as raised:
        pool.invoke({"action": "exit"})
    assert raised.value.error_type == "Runtime.ExitError"
    assert "Runtime exited with error: exit status 3" in raised.value.error_message
    replacement = pool.invoke({})
    assert replacement["pid"] != pid and replacement["calls"] == 1
    # An idle environment killed from outside is replaced too, not handed an event
    os.kill(replacement["pid"], signal.SIGKILL)
    wait_for(lambda: not alive(replacement["pid"]), what="the killed environment gone")
    assert pool.invoke({})["pid"] not in {pid, replacement["pid"]}
    assert pool.stats()["environments"] == 1


def test_a_handler_that_cannot_import_fails_the_cold_start_and_frees_its_place(make_pool):
    pool = make_pool(cap=1, handler="broken.handler")
    with pytest.raises(FunctionError) as raised:
        pool.prewarm()
    assert raised.value.error_type == "RuntimeError" and raised.value.error_message == "cannot start"
    with pytest.raises(FunctionError):  # the cap of 1 was given back: this is a new cold start, not a wait
        pool.invoke({})
    assert pool.stats()["init_errors"] == 2 and pool.stats()["environments"] == 0


def test_stdout_is_the_handlers_and_does_not_touch_the_frames(make_pool):
    pool = make_pool()
    assert pool.invoke({"action": "print"})["calls"] == 1
    assert pool.invoke({})["calls"] == 2


def test_an_environment_exits_when_its_stdin_closes_even_mid_invocation(code_dir):
    # What happens when the stack stops, or dies (the kernel closes the pipe's other end)
    spec = FunctionSpec(logical_id="F", name="F", code_dir=code_dir, handler_name="app.handler", timeout=60,
                        memory_mb=128, properties={})
    environment = ExecutionEnvironment(spec)
    environment.start()
    outcome: list[BaseException] = []

    def invoke() -> None:
        try:
            environment.invoke({"action": "sleep", "seconds": 60}, "r", 60)
        except FunctionError as error:
            outcome.append(error)

    thread = threading.Thread(target=invoke)
    thread.start()
    environment.begin_stop()
    thread.join(10)
    assert outcome and isinstance(outcome[0], FunctionError) and outcome[0].error_type == "Runtime.ExitError"
    assert environment.pid is not None and not alive(environment.pid)


def test_environments_die_with_the_process_that_started_them(code_dir, tmp_path):
    # Given a parent process with a warm environment, killed without a chance to clean up
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from freeinference_batch_local.environments import EnvironmentPool
        from freeinference_batch_local.handlers import FunctionSpec
        spec = FunctionSpec(logical_id="F", name="F", code_dir=Path({str(code_dir)!r}), handler_name="app.handler",
                            timeout=60, memory_mb=128, properties={{}})
        pool = EnvironmentPool(spec, max_environments=1)
        print(pool.invoke({{}})["pid"], flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(parent.stdout.strip())
    # Then its environment exits by itself
    wait_for(lambda: not alive(child), what="the orphaned environment to exit")


def test_close_stops_every_environment(make_pool):
    pool = make_pool(cap=2)
    invoke_together(pool, [{"action": "sleep", "seconds": 0.3}] * 2)
    pids = pool.pids()
    assert len(pids) == 2
    pool.close()
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(FunctionError):
        pool.invoke({})


@pytest.fixture
def moto_queue(monkeypatch):
    with MotoServer() as server:
        for name, value in {"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": "test",
                            "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)  # what the stack sets; the environments inherit it
        sqs = boto3.client("sqs", endpoint_url=server.endpoint_url, region_name="us-east-1",
                           aws_access_key_id="test", aws_secret_access_key="test")
        yield sqs.create_queue(QueueName=f"q-{uuid.uuid4().hex[:8]}")["QueueUrl"]


def test_an_sqs_send_in_an_environment_notifies_the_parent_before_the_invocation_ends(make_pool, moto_queue):
    # Given a pool whose notices are recorded, with the time the invocation ended
    notices: list[tuple[str, float]] = []
    pool = make_pool(on_notice=lambda what: notices.append((what, time.monotonic())))
    # When the handler sends a message and then works on for a while
    pool.invoke({"action": "send", "queue_url": moto_queue, "then_sleep": 0.5})
    ended = time.monotonic()
    # Then the parent heard of the send at once, not when the invocation ended
    assert [what for what, _ in notices] == ["sqs"]
    assert ended - notices[0][1] >= 0.4


def test_overlapping_schedule_ticks_run_in_environments_of_their_own(make_pool, tmp_path, monkeypatch):
    # Given a schedule whose runs (0.4 s) outlast its interval (0.1 s), on a function of concurrency 2
    ticks_dir = tmp_path / "ticks"
    ticks_dir.mkdir()
    monkeypatch.setenv("TEST_TICKS_DIR", str(ticks_dir))
    pool = make_pool(cap=2)
    pool.prewarm()
    timer = ScheduleTimer(name="TestFunction", handler=pool, interval=0.1, max_concurrency=2).start()
    try:
        # When it ticks for a while
        wait_for(lambda: len(list(ticks_dir.iterdir())) >= 6, timeout=20, what="six runs")
    finally:
        timer.stop(timeout=5)
    # Then runs overlapped, in two environments, never more than two at once
    runs = [(name.split("-")[0], *map(float, path.read_text().split())) for path in ticks_dir.iterdir()
            for name in [path.name]]
    assert len({pid for pid, _, _ in runs}) == 2
    assert any(a_start < b_end and b_start < a_end and a_pid != b_pid
               for a_pid, a_start, a_end in runs for b_pid, b_start, b_end in runs)
    stats = timer.stats()
    assert stats["max_in_flight"] == 2 and pool.stats()["max_busy"] == 2 and stats["errors"] == 0


def test_each_function_of_the_template_runs_up_to_its_concurrency():
    functions = functions_from_template(load_template(repo_root() / "template.yaml"))
    caps = {logical_id: function.concurrency for logical_id, function in functions.items()}
    # Each its reserved concurrency, the API's named by a parameter of the template (its default)
    assert caps["GlmFlashModel/WorkerFunction"] == 8 and caps["Qwen35bModel/WorkerFunction"] == 8
    assert caps["ApiFunction"] == 50
    assert caps["ExpireFunction"] == caps["SweepFunction"] == caps["PurgeFunction"] == 2
    # A function reserving none runs at most the local cap
    unreserved = functions["ApiFunction"]
    unreserved.properties.pop("ReservedConcurrentExecutions")
    assert unreserved.concurrency == LOCAL_UNRESERVED_CONCURRENCY


def test_a_stream_poller_invokes_its_function_in_the_functions_environments(make_pool):
    # Given a table with a stream, and a stream poller given the function's pool (as the local
    # stack gives the status-events function's)
    with MotoServer() as moto:
        session = boto3.session.Session(region_name="us-east-1", aws_access_key_id="test",
                                        aws_secret_access_key="test")
        dynamodb = session.client("dynamodb", endpoint_url=moto.endpoint_url)
        table = dynamodb.create_table(
            TableName="t", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"})["TableDescription"]
        pool = make_pool(cap=1)
        poller = StreamPoller(name="TestFunction", streams=session.client("dynamodbstreams",
                                                                         endpoint_url=moto.endpoint_url),
                              sqs=None, stream_arn=table["LatestStreamArn"], handler=pool, idle_sleep=0.05).start()
        try:
            # When items change
            for value in ("a", "b"):
                dynamodb.put_item(TableName="t", Item={"pk": {"S": "x"}, "v": {"S": value}})
            # Then the function ran in an execution environment of its own, not in this process
            wait_for(lambda: pool.stats()["invocations"] >= 1, what="an invocation of the stream's records")
            assert poller.wait_idle(timeout=10)
            assert pool.stats()["invocations"] == poller.stats()["invocations"] and not poller.stats()["errors"]
            assert pool.pids() and os.getpid() not in pool.pids()
        finally:
            poller.stop(timeout=5)
