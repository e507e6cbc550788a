"""The web console in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
which `make install` installs) driven by Selenium against the session's local stack.

One browser session for the module (starting Chromium costs seconds), one account of its own
(`e2e-console`), so its batches are the only ones it lists. The tests run in file order and
leave the browser signed in. Every wait has a deadline (WebDriverWait); nothing sleeps.

Screenshots of each page are written to $CONSOLE_SCREENSHOTS (the user guide's come from
`CONSOLE_SCREENSHOTS=docs/console .venv/bin/pytest tests/e2e/test_console.py`), else to a
temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import REPO, Api, StackProcess, wait_for
from console_browser import (
    WAIT_SECONDS,
    batch_row,
    by_id,
    csp_violations,
    open_batch,
    result_rows,
    row_progress,
    screenshot,
    sign_in,
    until,
    visible,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

CLI = [sys.executable, "-c", "from freeinference_batch_client.cli import main; main()"]
MODEL = "glm-5.3-flash"
# Three kinds of markup a page that used innerHTML would turn into elements (and, without the CSP,
# run): an image whose error handler sets a flag, a script, and a bold tag.
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script><b>bold</b>'


def request(custom_id: str, content: str = "Hello", **body: Any) -> dict:
    return {"custom_id": custom_id, "body": {"model": MODEL, "messages": [{"role": "user", "content": content}],
                                             **body}}


@pytest.fixture(scope="module")
def key(stack: StackProcess) -> str:
    return stack.create_key("e2e-console", tier="internal")


@pytest.fixture(scope="module")
def api(stack: StackProcess, key: str) -> Api:
    return stack.api(key)


@pytest.fixture(scope="module")
def origin(stack: StackProcess) -> str:
    return stack.base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ---------------------------------------------------------------- served as files, with headers


def test_every_console_answer_carries_a_csp_without_unsafe_inline(origin: str, stack: StackProcess) -> None:
    for path in ("/", "/console/console.js", "/console/progress.js", "/console/api.js", "/console/batch.js",
                 "/console/console.css", "/console/favicon.svg", "/console/nothing.js"):
        answer = requests.get(origin + path, timeout=30)
        assert answer.status_code == (404 if "nothing" in path else 200), path
        policy = answer.headers["Content-Security-Policy"]
        directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, path
        assert directives["default-src"] == "'none'"
        for kind in ("script-src", "style-src", "img-src"):
            assert directives[kind] == "'self'", (path, kind)
        # The API, and the payload bucket a presigned body_url points at (here: the moto server).
        moto = json.loads(stack.state_file.read_text())["env"]["AWS_ENDPOINT_URL"]
        assert directives["connect-src"].split() == ["'self'", moto.rstrip("/")], path
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert directives["frame-ancestors"] == "'none'"
    assert requests.get(origin + "/console/console.js", timeout=30).headers["Content-Type"].startswith(
        "text/javascript")
    # The API stays under /v1: an unknown path is API Gateway's 404, not the console.
    assert requests.get(origin + "/v2/batches", timeout=30).json() == {"message": "Not Found"}


def test_the_console_never_builds_html_from_strings() -> None:
    scripts = sorted((REPO / "functions" / "console" / "static").glob("*.js"))
    assert [script.name for script in scripts] == ["api.js", "batch.js", "console.js", "progress.js"]
    for script in scripts:
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in script.read_text(), (script.name, sink)
    page = (REPO / "functions" / "console" / "static" / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "an inline script"
    assert " style=" not in page and "<style" not in page, "an inline style"
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "something from another origin"


# ---------------------------------------------------------------- in the browser


def test_sign_in_keeps_the_key_in_this_tab_only_and_sign_out_forgets_it(
    browser: WebDriver, origin: str, key: str, shots: Path
) -> None:
    browser.get(origin + "/")
    until(browser, lambda d: visible(d, "sign-in-view"), "the sign-in view")
    field = by_id(browser, "api-key")
    assert field.get_attribute("type") == "password"
    assert browser.find_element(By.CSS_SELECTOR, 'label[for="api-key"]').text == "API key"
    screenshot(browser, shots, "sign-in")

    # A refused key: an error, and nothing stored
    field.send_keys("hyi-not-a-key")
    field.send_keys("\n")
    until(browser, lambda d: visible(d, "error") and "refused" in by_id(d, "error").text, "the refusal")
    assert browser.execute_script("return sessionStorage.length") == 0

    # The right key: the batches view; the key in sessionStorage only, never in the URL or a cookie
    field.clear()
    field.send_keys(key + "\n")
    until(browser, lambda d: visible(d, "batches-view"), "the batches view")
    assert browser.execute_script("return Object.values(sessionStorage)") == [key]
    assert browser.execute_script("return localStorage.length") == 0
    assert browser.get_cookies() == []
    assert key not in browser.current_url
    assert not visible(browser, "error")

    # Sign out: the key is gone, and a reload asks for it again
    by_id(browser, "sign-out").click()
    until(browser, lambda d: visible(d, "sign-in-view"), "the sign-in view after signing out")
    assert browser.execute_script("return sessionStorage.length") == 0
    browser.refresh()
    until(browser, lambda d: visible(d, "sign-in-view"), "the sign-in view after a reload")
    sign_in(browser, origin, key)


def test_a_running_batch_progress_moves_in_the_list_and_on_its_page(
    browser: WebDriver, origin: str, key: str, api: Api, shots: Path
) -> None:
    # Given a batch of 12 requests on 4 chains (request i on chain i % 4), each chain slower than
    # the one before: a run counts what it settled when it leaves its chain, so the counts move
    # as the chains finish, at about 0.3, 4.5, 9 and 13.5 s
    latencies = [0.1, 1.5, 3, 4.5]
    created = api.create_batch([request(f"slow-{i}", f"Think [sim:latency={latencies[i % 4]}]") for i in range(12)],
                               metadata={"project": "console-demo", "owner": "eval-team"})
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    sign_in(browser, origin, key)
    browser.get(origin + "/")

    # When the list is watched, it refreshes by itself: some requests done, not all, then all
    seen: list[tuple[int, int]] = []

    def watched(d: WebDriver) -> tuple[int, int] | None:
        value = row_progress(d, batch_id)
        if value and (not seen or seen[-1] != value):
            seen.append(value)
        return value

    def progressed(d: WebDriver) -> bool:
        value = watched(d)
        return bool(value and 0 < value[0] < value[1])

    until(browser, progressed, "the batch part done in the list")
    row = batch_row(browser, batch_id)
    assert row is not None
    cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == batch_id and cells[1] == "in_progress"
    assert re.fullmatch(r"\d+ / 0 / 12", cells[3]) and "project: console-demo" in cells[6]
    screenshot(browser, shots, "batches")
    # (every value on the way is recorded: the first one seen may already be part done)
    until(browser, lambda d: watched(d) == (12, 12) and "completed" in batch_row(d, batch_id).text,
          "the batch completed in the list")
    assert [value for value, _ in seen] == sorted(value for value, _ in seen) and len(seen) >= 2, seen

    # And on its own page the counts, timestamps and results are shown
    open_batch(browser, origin, batch_id)
    until(browser, lambda d: by_id(d, "batch-progress").get_attribute("value") == "12", "the page's progress")
    details = by_id(browser, "batch-details").text
    assert "completed" in details and "console-demo" in details and "UTC" in details
    assert by_id(browser, "batch-progress-label").text == "12 of 12 requests finished (12 completed, 0 failed)"
    until(browser, lambda d: len(result_rows(d)) == 12, "12 result rows")
    assert by_id(browser, "cancel").get_attribute("disabled") is not None  # a finished batch
    assert not visible(browser, "retry") and not visible(browser, "batch-estimate")  # nothing failed, nothing runs


def test_the_results_table_pages_filters_and_opens_a_whole_result(
    browser: WebDriver, origin: str, api: Api, shots: Path
) -> None:
    # Given 55 requests (more than a page of 50), every fifth refused as invalid by the upstream
    items = [request(f"r-{i:02d}", "Bad [sim:status=400]" if i % 5 == 0 else f"Question {i}") for i in range(55)]
    created = api.create_batch(items)
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    api.wait_for_status(batch_id, "completed", timeout=90)
    open_batch(browser, origin, batch_id)

    # The first page: 50 rows in submission order, each with its status, error and answer's start
    until(browser, lambda d: len(result_rows(d)) == 50, "50 rows")
    first = [row.find_elements(By.TAG_NAME, "td") for row in result_rows(browser)[:2]]
    assert [cell.text for cell in first[0][:4]] == ["r-00", "failed", "invalid_request", first[0][3].text]
    assert first[0][3].text  # the upstream's message
    assert first[1][0].text == "r-01" and first[1][1].text == "completed" and first[1][4].text.startswith(
        "Simulated reply")
    screenshot(browser, shots, "batch")

    # Filtered in the page: only the failed ones
    Select(by_id(browser, "status-filter")).select_by_value("failed")
    until(browser, lambda d: len(result_rows(d)) == 10, "the failed rows of page 1")
    assert {row.find_elements(By.TAG_NAME, "td")[1].text for row in result_rows(browser)} == {"failed"}
    Select(by_id(browser, "status-filter")).select_by_value("")

    # The next page through the API's `after`, and back
    by_id(browser, "results-next").click()
    until(browser, lambda d: [r.find_element(By.TAG_NAME, "td").text for r in result_rows(d)]
          == [f"r-{i}" for i in range(50, 55)], "page 2")
    assert by_id(browser, "results-next").get_attribute("disabled") is not None
    by_id(browser, "results-previous").click()
    until(browser, lambda d: len(result_rows(d)) == 50, "page 1 again")

    # A row opens the whole result as JSON (by keyboard: the custom_id is a button)
    button = result_rows(browser)[1].find_element(By.TAG_NAME, "button")
    button.send_keys("\n")
    until(browser, lambda d: visible(d, "result-dialog"), "the result dialog")
    shown = json.loads(by_id(browser, "result-json").text)
    expected = api.get(f"/batches/{batch_id}/results", params={"limit": 2}).json()["data"][1]
    assert shown == expected
    screenshot(browser, shots, "result")
    browser.find_element(By.CSS_SELECTOR, "#result-dialog button").click()
    until(browser, lambda d: not visible(d, "result-dialog"), "the dialog closed")


def test_cancel_asks_first_then_cancels(browser: WebDriver, origin: str, api: Api, shots: Path) -> None:
    # Given a running batch of 40 requests of 5 s each (about 50 s on 4 chains: it is cancelled first)
    created = api.create_batch([request(f"c-{i}", "Wait [sim:latency=5]") for i in range(40)])
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    open_batch(browser, origin, batch_id)

    # Cancel asks; "Keep it running" leaves the batch alone
    by_id(browser, "cancel").click()
    until(browser, lambda d: visible(d, "confirm-dialog"), "the confirmation")
    assert by_id(browser, "confirm-yes").text == "Cancel batch"
    screenshot(browser, shots, "cancel")
    by_id(browser, "confirm-no").click()
    until(browser, lambda d: not visible(d, "confirm-dialog"), "the confirmation closed")
    assert api.batch(batch_id)["status"] in {"validating", "in_progress"}

    # "Cancel batch" cancels it: the API says so, and so does the page
    by_id(browser, "cancel").click()
    until(browser, lambda d: visible(d, "confirm-dialog"), "the confirmation")
    by_id(browser, "confirm-yes").click()
    status = api.wait_for_status(batch_id, {"cancelling", "cancelled"})["status"]
    assert status in {"cancelling", "cancelled"}
    until(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#batch-details dd").text in {"cancelling", "cancelled"},
          "the page showing it")
    api.wait_for_status(batch_id, "cancelled", timeout=60)


def test_retry_failed_makes_a_child_batch_and_links_parent_and_child(
    browser: WebDriver, origin: str, api: Api, shots: Path
) -> None:
    # Given a finished batch of 4, two of them refused by the upstream
    items = [request(f"t-{i}", "Bad [sim:status=400]" if i % 2 else "Fine") for i in range(4)]
    created = api.create_batch(items)
    assert created.status_code == 200, created.text
    parent = created.json()["id"]
    api.wait_for_status(parent, "completed", timeout=90)
    open_batch(browser, origin, parent)
    until(browser, lambda d: visible(d, "retry"), "the retry button")
    assert by_id(browser, "retry").text == "Retry failed (2)…"
    screenshot(browser, shots, "retry")

    # When "Retry failed" is confirmed
    by_id(browser, "retry").click()
    until(browser, lambda d: visible(d, "confirm-dialog"), "the confirmation")
    assert by_id(browser, "confirm-yes").text == "Retry 2"
    by_id(browser, "confirm-yes").click()

    # Then the page shows the child: the failed two, in order, its "Retry of" a link to the parent
    until(browser, lambda d: by_id(d, "batch-title").text not in {"", parent}
          and by_id(d, "batch-view").get_attribute("aria-busy") == "false", "the child's page")
    child = by_id(browser, "batch-title").text
    assert api.batch(child)["retry_of"] == parent
    assert [line["custom_id"] for line in api.results(child)] == ["t-1", "t-3"]
    browser.find_element(By.CSS_SELECTOR, f'#batch-details a[href="#/batches/{parent}"]').click()

    # And the parent, unchanged, links its child
    until(browser, lambda d: by_id(d, "batch-title").text == parent and d.find_elements(
        By.CSS_SELECTOR, f'#batch-details a[href="#/batches/{child}"]'), "the parent linking its child")
    assert api.batch(parent)["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    assert api.batch(parent)["retry_of"] is None


def test_progress_functions_give_the_rate_finish_and_waiting_message(browser: WebDriver, origin: str, key: str) -> None:
    # Given a batch 10 minutes in progress with 30 of 120 finished (progress.js, called in the page)
    sign_in(browser, origin, key)
    told = browser.execute_script("""
        const now = 1800000000000, start = 1800000000 - 600, when = (ms) => new Date(ms).toISOString();
        const batch = (status, done, fields = {}) => ({status, in_progress_at: start, expires_at: 1800086400,
            request_counts: {total: 120, completed: done, failed: done ? 5 : 0}, ...fields});
        const P = BatchProgress, running = batch("in_progress", 25);
        return [P.describe(running, [], now, when), P.describe(running, [{at: now - 120000, done: 20}], now, when),
                P.describe(running, [{at: now - 120000, done: 30}], now, when),
                P.describe(running, [{at: now - 30000, done: 20}], now, when),
                P.describe(batch("in_progress", 25, {expires_at: 1800000600}), [], now, when),
                P.describe(batch("in_progress", 0), [], now, when), P.describe(batch("completed", 25), [], now, when),
                P.describe(batch("cancelling", 25), [], now, when),
                P.remember([{at: now - 301000, done: 1}, {at: now - 299000, done: 2}], running, now),
                [undefined, null, {reason: "concurrency", message: "Every slot is in use"}].map(
                    (waiting) => P.waitingMessage(batch("in_progress", 25, {waiting})))];
    """)
    assert told == [
        # over its running time (nothing read a minute before): 30 in 10 minutes, 90 to go
        "3.0 requests a minute over 10 min running; 90 to go, done about 2027-01-15T08:30:00.000Z (in 30 min).",
        # recent: 10 more in the last 2 minutes; none; readings only 30 s apart count as not recent
        "5.0 requests a minute over the last 2 min; 90 to go, done about 2027-01-15T08:18:00.000Z (in 18 min).",
        "No request has finished in the last 2 min: no finish to estimate.",
        "3.0 requests a minute over 10 min running; 90 to go, done about 2027-01-15T08:30:00.000Z (in 30 min).",
        "3.0 requests a minute over 10 min running; 90 to go, done about 2027-01-15T08:30:00.000Z (in 30 min). But its "
        "completion window closes first, at 2027-01-15T08:10:00.000Z: what has not started by then expires.",
        "Not enough progress yet to estimate a finish: no request has finished.",
        None, None,  # nothing more runs
        [{"at": 1800000000000 - 299000, "done": 2}, {"at": 1800000000000, "done": 30}],  # five minutes kept
        [None, None, "Every slot is in use"],
    ]


def test_a_running_batchs_page_shows_its_rate_and_estimated_finish(
    browser: WebDriver, origin: str, api: Api, shots: Path
) -> None:
    # Given 40 requests on 4 chains (request i on chain i % 4): chain 0's at once, the others' 1 s
    # each: 10 finish at once, the other 30 some 10 s later
    created = api.create_batch([request(f"p-{i}", "Now" if i % 4 == 0 else "Wait [sim:latency=1]") for i in range(40)])
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    open_batch(browser, origin, batch_id)
    shown = re.compile(r"([\d.]+) requests a minute over (\d+) (s|min) running; (\d+) to go, done about "
                       r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in (\d+) (s|min)\)\.")

    # When it is part done, its rate and finish follow from its counts and running time
    def estimate(d: WebDriver) -> tuple[int, re.Match] | None:
        done, text = d.execute_script("return [document.getElementById('batch-progress').value, "
                                      "document.getElementById('batch-estimate').textContent]")
        match = shown.fullmatch(text)
        return (int(done), match) if match and 0 < done < 40 else None

    done, match = until(browser, estimate, "a rate and an estimated finish")
    screenshot(browser, shots, "progress")
    rate, to_go = float(match[1]), int(match[4])
    # (shown rounded to whole seconds, or minutes: each within half of one)
    (running, running_slack), (finish_in, finish_slack) = (
        (int(match[i]) * unit, unit / 2) for i in (2, 5) for unit in [60 if match[i + 1] == "min" else 1])
    assert to_go == 40 - done
    # done / running a minute, and the rest at that rate
    assert done * 60 / (running + running_slack) - 0.5 <= rate <= done * 60 / max(running - running_slack, 0.01) + 0.5
    assert (to_go * (running - running_slack) / done - finish_slack <= finish_in
            <= to_go * (running + running_slack) / done + finish_slack)
    # Then, finished, nothing is estimated any more
    until(browser, lambda d: by_id(d, "batch-progress").get_attribute("value") == "40"
          and not visible(d, "batch-estimate"), "the batch finished, no estimate")


def test_download_writes_the_output_file_the_cli_writes(
    browser: WebDriver, origin: str, stack: StackProcess, key: str, api: Api, downloads: Path, tmp_path: Path
) -> None:
    # Given a finished batch: an answer, a failure, and an answer too big for any page (a body_url)
    created = api.create_batch([
        request("d-ok", "Small answer"),
        request("d-bad", "Refused [sim:status=400]"),
        request("d-big", "Huge [sim:pad=1000000]"),
    ])
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    api.wait_for_status(batch_id, "completed", timeout=90)
    big = api.results(batch_id)[2]["response"]
    assert big["body"] is None and big["body_url"], "the big answer comes as a link, on a page of its own"

    # When it is downloaded from its page
    open_batch(browser, origin, batch_id)
    # (the big one is on a page of its own: the first page stops before it)
    until(browser, lambda d: len(result_rows(d)) == 2 and by_id(d, "results-next").is_enabled(), "2 rows of 3")
    by_id(browser, "download").click()
    saved = downloads / f"{batch_id}_output.jsonl"
    wait_for(lambda: saved.is_file() and saved.stat().st_size > 0, timeout=WAIT_SECONDS, message="the download")

    # Then it holds the lines `freeinference-batch results -o` writes, the big body fetched
    cli_output = tmp_path / "cli.jsonl"
    env = {name: value for name, value in os.environ.items() if not name.startswith(("FREEINFERENCE_", "AWS_"))}
    env.update({"FREEINFERENCE_BASE_URL": stack.base_url, "FREEINFERENCE_API_KEY": key})
    done = subprocess.run([*CLI, "results", batch_id, "-o", str(cli_output)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    downloaded = [json.loads(line) for line in saved.read_text(encoding="utf-8").splitlines()]
    assert downloaded == [json.loads(line) for line in cli_output.read_text(encoding="utf-8").splitlines()]
    assert len(downloaded[2]["response"]["body"]["choices"][0]["message"]["content"]) > 1_000_000
    assert downloaded[1]["response"]["body"]["error"]["code"] == "invalid_request" and downloaded[1]["error"] is None
    assert csp_violations(browser) == []


def test_a_malformed_url_hash_reads_as_not_a_batch_id(browser: WebDriver, origin: str, key: str) -> None:
    # Given the console, signed in, recording uncaught errors and each hash change it has routed
    # (a listener added after the console's runs after it, even when the console's throws)
    sign_in(browser, origin, key)
    browser.execute_script("window.__errors = []; window.onerror = (message) => { window.__errors.push(message); };"
                           "window.addEventListener('hashchange', () => { window.__routed = location.hash; });")
    # When the hash holds escapes that do not decode (decodeURIComponent throws URIError)
    for hash_ in ("#/batches/%E0%A4%A", "#/batches/%"):
        # (a row the list's next render replaces: its absence says the list has loaded since)
        browser.execute_script("document.querySelector('#batches-table tbody').replaceChildren("
                               "Object.assign(document.createElement('tr'), {id: 'stale-row'}))")
        browser.execute_script("location.hash = arguments[0]", hash_)
        until(browser, lambda d, h=hash_: d.execute_script("return window.__routed") == h, f"{hash_} routed")
        # Then it is not a batch id: the list, and nothing thrown
        assert browser.execute_script("return window.__errors") == [], hash_
        until(browser, lambda d: visible(d, "batches-view"), "the list")
        # and the page says so, still once the list has loaded
        until(browser, lambda d: not d.find_elements(By.ID, "stale-row"), "the list loaded")
        assert visible(browser, "error") and by_id(browser, "error").text == "That is not a batch id.", hash_
        browser.execute_script("location.hash = arguments[0]", "#/")
    until(browser, lambda d: not visible(d, "error"), "the error cleared by moving on")


def test_untrusted_text_stays_text_and_the_batch_can_be_deleted(
    browser: WebDriver, origin: str, api: Api, shots: Path
) -> None:
    # Given markup in a custom_id, a metadata value and the answer (the upstream echoes the prompt)
    created = api.create_batch([request(XSS, f"Repeat {XSS}")], metadata={"note": XSS})
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    api.wait_for_status(batch_id, "completed", timeout=90)
    browser.get(origin + "/")
    until(browser, lambda d: batch_row(d, batch_id) is not None, "the batch listed")
    row = batch_row(browser, batch_id)
    assert f"note: {XSS}" in row.text
    open_batch(browser, origin, batch_id)
    until(browser, lambda d: len(result_rows(d)) == 1, "its row")
    cells = result_rows(browser)[0].find_elements(By.TAG_NAME, "td")
    assert cells[0].text == XSS
    assert XSS in cells[4].text
    assert XSS in by_id(browser, "batch-details").text
    result_rows(browser)[0].click()
    until(browser, lambda d: visible(d, "result-dialog"), "the result dialog")
    assert json.loads(by_id(browser, "result-json").text)["custom_id"] == XSS
    # Nothing was parsed as markup: no element came from the payload, no script ran
    assert browser.find_elements(By.CSS_SELECTOR, "main img, main script, main b, dialog img, dialog b") == []
    assert browser.execute_script("return window.__xss === undefined")
    browser.find_element(By.CSS_SELECTOR, "#result-dialog button").click()

    # Delete asks, then deletes: back to the list, and the API no longer has it
    by_id(browser, "delete").click()
    until(browser, lambda d: visible(d, "confirm-dialog"), "the confirmation")
    assert by_id(browser, "confirm-yes").text == "Delete batch"
    by_id(browser, "confirm-yes").click()
    until(browser, lambda d: visible(d, "batches-view"), "the list after deleting")
    assert api.get(f"/batches/{batch_id}").status_code == 404
    until(browser, lambda d: batch_row(d, batch_id) is None, "the deleted batch gone from the list")


def test_on_a_phone_the_list_is_readable_and_the_keyboard_reaches_everything(
    browser: WebDriver, origin: str, shots: Path
) -> None:
    browser.set_window_size(390, 844)
    try:
        browser.get(origin + "/")
        until(browser, lambda d: visible(d, "batches-view") and batch_row(d, batch_row_id(d)) is not None,
              "the list on a phone")
        # No horizontal scrolling of the page: the table became cards
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
        screenshot(browser, shots, "batches-phone")
        # Tab from the top reaches the sign-out button and a batch link
        reached = set()
        body = browser.find_element(By.TAG_NAME, "body")
        body.click()
        for _ in range(12):
            browser.switch_to.active_element.send_keys("\t")
            active = browser.switch_to.active_element
            reached.add(active.get_attribute("id") or active.get_attribute("href") or active.tag_name)
        assert "sign-out" in reached and any("#/batches/" in str(item) for item in reached), reached
    finally:
        browser.set_window_size(1280, 1000)


def batch_row_id(driver: WebDriver) -> str:
    rows = driver.find_elements(By.CSS_SELECTOR, "#batches-table tr[data-batch-id]")
    return rows[0].get_attribute("data-batch-id") if rows else ""
