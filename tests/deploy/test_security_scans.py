"""Security scanners the project did not write, run on every test run: checkov on the three
templates (no failed check; each skipped one says why in the resource's `Metadata.checkov`), and
bandit on the code that ships or runs a stack (nothing of medium or high severity). Both live in
their own venv, `.tools/security` (`make install`): checkov's pins fight the project's."""

from __future__ import annotations

import json
import subprocess

from tests.deploy.templates import MODEL_TEMPLATE, MONITORING_TEMPLATE, REPO, TEMPLATE

SCANNERS = REPO / ".tools" / "security" / "bin"
# What bandit reads: the service (the layer), the functions, the client and CLI, the local stack.
CODE = ["layers/batch_core/freeinference_batch", "functions", "clients", "local_stack/freeinference_batch_local"]


def _scanner(name: str) -> str:
    path = SCANNERS / name
    assert path.exists(), f"{path} is not installed: make install"
    return str(path)


def test_checkov_fails_no_check_of_the_templates_and_each_skip_says_why() -> None:
    files = [argument for template in (TEMPLATE, MODEL_TEMPLATE, MONITORING_TEMPLATE)
             for argument in ("-f", str(template))]
    result = subprocess.run([_scanner("checkov"), *files, "--framework", "cloudformation", "-o", "json",
                             "--skip-download"], capture_output=True, text=True, timeout=300, cwd=REPO)
    report = json.loads(result.stdout)
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert report["summary"]["failed"] == 0 and not failed, failed
    assert report["summary"]["passed"] > 0 and report["summary"]["parsing_errors"] == 0, report["summary"]
    unexplained = [(c["check_id"], c["resource"]) for c in report["results"]["skipped_checks"]
                   if len((c["check_result"].get("suppress_comment") or "").strip()) < 20]
    assert not unexplained, f"skipped without a reason: {unexplained}"


def test_bandit_finds_nothing_of_medium_or_high_severity() -> None:
    result = subprocess.run([_scanner("bandit"), "-r", *CODE, "--severity-level", "medium", "-f", "json", "-q"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    report = json.loads(result.stdout)
    found = [f"{r['test_id']} {r['filename']}:{r['line_number']} {r['issue_text']}" for r in report["results"]]
    assert not found, "\n".join(found)
    assert report["metrics"]["_totals"]["loc"] > 10_000  # it read the code
