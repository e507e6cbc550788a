"""A batch created from a file, on its console page (issue 32): its input, output and error files'
ids, each with a button that saves the file's content. The content comes from
`GET /v1/files/{id}/content`, a redirect to a presigned URL of the payload bucket (here the moto
server), which the page's fetch follows to another origin under its CSP: only a real browser
shows that the download works.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from conftest import StackProcess, wait_for
from console_browser import WAIT_SECONDS, by_id, csp_violations, open_batch, sign_in, until
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

MODEL = "qwen3.6-35b"
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def key(stack: StackProcess) -> str:
    return stack.create_key("e2e-console-files", tier="internal")


def test_a_file_batchs_page_downloads_its_input_output_and_error_files(
    stack: StackProcess, key: str, browser: WebDriver, downloads: Path, tmp_path: Path
) -> None:
    # Given a batch created from a file through the OpenAI SDK, one of its requests refused upstream
    sdk = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=2, timeout=60)
    lines = [{"custom_id": f"f-{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "messages": [{"role": "user", "content": f"File {n}" + (
                  " [sim:status=400]" if n == 2 else "")}]}} for n in range(4)]
    source = tmp_path / "input.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    uploaded = sdk.files.create(file=source.open("rb"), purpose="batch")
    created = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")
    batch = wait_for(lambda: (b := sdk.batches.retrieve(created.id)).status in FINAL and b, timeout=WAIT_SECONDS,
                     interval=0.5, message="the file batch to end")
    assert batch.status == "completed" and batch.output_file_id and batch.error_file_id, batch

    # When its page is open
    origin = stack.base_url.removesuffix("/v1")
    sign_in(browser, origin, key)
    open_batch(browser, origin, batch.id)
    details = by_id(browser, "batch-details").text

    # Then each file's id is shown, and its button saves what the Files API serves
    for kind, file_id in (("input", uploaded.id), ("output", batch.output_file_id), ("error", batch.error_file_id)):
        assert file_id in details, (kind, details)
        browser.find_element(By.XPATH, f"//button[normalize-space()='Download {kind} file']").click()
        saved = downloads / f"{file_id}.jsonl"
        wait_for(lambda saved=saved: saved.is_file() and saved.stat().st_size > 0, timeout=WAIT_SECONDS,
                 message=f"the {kind} file saved")
        assert saved.read_bytes() == sdk.files.content(file_id).content, kind
        until(browser, lambda d, file_id=file_id: by_id(d, "announcer").get_attribute("textContent")
              == f"Downloaded {file_id}.", f"the page announcing the {kind} file downloaded")
    assert (downloads / f"{uploaded.id}.jsonl").read_bytes() == source.read_bytes()
    outputs = [json.loads(line) for line in (downloads / f"{batch.output_file_id}.jsonl").read_text().splitlines()]
    errors = [json.loads(line) for line in (downloads / f"{batch.error_file_id}.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in outputs] == ["f-0", "f-1", "f-3"]
    assert [(line["custom_id"], line["response"]["status_code"]) for line in errors] == [("f-2", 400)]
    assert csp_violations(browser) == []
