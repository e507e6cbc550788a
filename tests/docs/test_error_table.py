"""The user guide's table of refusals lists every 400, 409, 413, 422 and 429 the service can
answer: each place in the layer that builds such an error, its status and code, and the words of
its message (the literal parts of the f-string; what it fills in is `<...>` in the table)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from freeinference_batch.core import errors

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "layers/batch_core/freeinference_batch"
GUIDE = REPO / "docs/USER_GUIDE.md"
TABLE_HEADING = "## Every refusal and its message"
STATUSES = {400, 405, 409, 413, 422, 429}
# The ApiError subclasses of those statuses, by name.
CLASSES = {name: cls for name, cls in vars(errors).items()
           if isinstance(cls, type) and issubclass(cls, errors.ApiError) and cls.status in STATUSES}


def table_rows() -> list[tuple[int, str, str]]:
    """(status, code, message cell) of each row of the guide's table."""
    text = GUIDE.read_text()
    assert TABLE_HEADING in text, f"{GUIDE.name} has no section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1].strip("`"), cells[3].replace("`", "")))
    return rows


def words(node: ast.expr, functions: dict[str, ast.FunctionDef]) -> list[list[str]]:
    """The literal parts of a message expression, one list per message it can be (a call of a
    function of the module stands for each string it returns)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [[node.value]]
    if isinstance(node, ast.JoinedStr):
        return [[part.value for part in node.values if isinstance(part, ast.Constant)]]
    if isinstance(node, ast.IfExp):
        return words(node.body, functions) + words(node.orelse, functions)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
        return [parts for ret in ast.walk(functions[node.func.id]) if isinstance(ret, ast.Return) and ret.value
                for parts in words(ret.value, functions)]
    raise AssertionError(f"a message this test cannot read: {ast.unparse(node)}")


def raised_errors() -> list[tuple[str, int, str, list[str]]]:
    """(where, status, code, literal parts of the message) of each 4xx error the layer builds."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or path.name == "errors.py":
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in CLASSES or not node.args:
                continue
            cls = CLASSES[name]
            code = next((k.value.value for k in node.keywords if k.arg == "code"), cls.code)
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            found.extend((where, cls.status, code, parts) for parts in words(node.args[0], functions))
    return found


def listed(status: int, code: str, parts: list[str], rows: list[tuple[int, str, str]]) -> bool:
    """Some row of this status and code holds every literal part of the message, in order."""
    for row_status, row_code, message in rows:
        if (row_status, row_code) != (status, code):
            continue
        at = 0
        for part in (p for p in parts if p.strip()):
            at = message.find(part, at)
            if at < 0:
                break
            at += len(part)
        else:
            return True
    return False


def test_every_refusal_the_service_can_answer_is_in_the_guides_table():
    rows = table_rows()
    sites = raised_errors()
    assert len(sites) > 30  # the reading of the layer works
    missing = [f"{where}: {status} {code} {parts}" for where, status, code, parts in sites
               if not listed(status, code, parts, rows)]
    assert not missing, "not in the user guide's table of refusals:\n" + "\n".join(missing)


def test_every_way_a_request_can_be_wrong_is_in_the_guides_table():
    # validation._describe words the field at fault inside `requests[<i>] (custom_id ...): <...>`.
    tree = ast.parse((PACKAGE / "batches" / "validation.py").read_text())
    describe = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "_describe")
    row = next(message for status, code, message in table_rows() if "<what is wrong>" in message)
    returns = [parts for r in ast.walk(describe) if isinstance(r, ast.Return) and r.value
               for parts in words(r.value, {})]
    assert len(returns) >= 10
    missing = [parts for parts in returns if not listed(400, "invalid_request", parts, [(400, "invalid_request", row)])]
    assert not missing, missing


def test_the_table_has_the_specs_statuses_and_the_gateways_answers():
    rows = table_rows()
    assert {status for status, _, _ in rows} == STATUSES
    assert (413, "(API Gateway)", "Request Entity Too Large") in rows
    assert re.search(r"\| 429 \| \(API Gateway\)", GUIDE.read_text())
