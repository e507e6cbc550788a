"""Every command in README.md's bash blocks runs as written: at least, it parses.

`freeinference-batch ...` is parsed by its own click commands, `sam ...` by the SAM CLI's,
`aws ...` against botocore's service models, `make ...` by `make -n`. A command this test does
not know fails it, so a new kind of command in the README comes with a way to check it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import botocore.session
import click
import pytest
from freeinference_batch_client.cli import main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SAM_PYTHON = REPO / ".tools" / "sam" / "bin" / "python"
# The AWS CLI's options that every command takes.
AWS_GLOBAL_OPTIONS = {"--region", "--output", "--query", "--profile", "--endpoint-url", "--no-cli-pager"}
# The AWS CLI's own s3 commands (no botocore operation behind them): command -> options.
AWS_S3_COMMANDS = {"rb": {"--force"}, "rm": {"--recursive"}, "ls": {"--recursive"}}
# Commands shown for people to run by hand, not parsed here.
UNCHECKED = {"curl", "export", "cd"}


def readme_commands(text: str) -> list[list[str]]:
    """The commands of every ```bash block, as argv lists (comments dropped, continuations joined,
    quotes that span lines kept together)."""
    commands, pending = [], ""
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            pending = f"{pending}\n{line}" if pending else line
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            try:
                argv = shlex.split(pending, comments=True)
            except ValueError:  # a quote still open: the command goes on on the next line
                continue
            pending = ""
            while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
                argv = argv[1:]  # `NAME=value command ...`: the environment of one command
            # `< file` / `> file`: the shell's redirections, not the command's arguments
            argv = [a for i, a in enumerate(argv) if a not in ("<", ">") and (i == 0 or argv[i - 1] not in ("<", ">"))]
            if argv:
                commands.append(argv)
    assert not pending, f"unterminated command in README: {pending!r}"
    return commands


COMMANDS = readme_commands(README.read_text())


def _id(argv: list[str]) -> str:
    return " ".join(argv)[:80]


def parse_click(command: click.Command, args: list[str]) -> click.Context:
    """Parse `args` down to the leaf command as click would run them, without running anything."""
    ctx = command.make_context(command.name or "cli", list(args))
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def check_freeinference_batch(args: list[str]) -> None:
    parse_click(main, args)


def check_make(args: list[str]) -> None:
    result = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def check_aws(args: list[str]) -> None:
    service, operation, *options = args
    names = [o.split("=", 1)[0] for o in options if o.startswith("--")]
    if service == "s3" and operation in AWS_S3_COMMANDS:
        assert set(names) <= AWS_S3_COMMANDS[operation] | AWS_GLOBAL_OPTIONS, names
        return
    model = botocore.session.get_session().get_service_model(service)
    by_cli_name = {re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower(): name for name in model.operation_names}
    assert operation in by_cli_name, f"aws {service} has no command {operation}"
    members = model.operation_model(by_cli_name[operation]).input_shape.members
    accepted = {"--" + re.sub(r"(?<!^)(?=[A-Z])", "-", member).lower() for member in members}
    # The CLI's `--no-<flag>` of a boolean member (`--no-deletion-protection-enabled`)
    accepted |= {"--no-" + re.sub(r"(?<!^)(?=[A-Z])", "-", member).lower()
                 for member, shape in members.items() if shape.type_name == "boolean"}
    unknown = set(names) - accepted - AWS_GLOBAL_OPTIONS
    assert not unknown, f"aws {service} {operation} takes no {sorted(unknown)}"


_SAM_CHECK = """
import json, sys
from samcli.cli.main import cli
args = json.loads(sys.argv[1])
ctx = cli.make_context("sam", ["--help"], resilient_parsing=True)
command, names = cli, []
while args and not args[0].startswith("-") and hasattr(command, "get_command"):  # down the groups
    command = command.get_command(ctx, args.pop(0))
    assert command is not None, "no such sam command"
options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
unknown = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in options]
assert not unknown, f"unknown options {unknown}"
"""


def check_sam(args: list[str]) -> None:
    if not SAM_PYTHON.exists():
        pytest.skip("the SAM CLI is not installed (make install)")
    result = subprocess.run([str(SAM_PYTHON), "-c", _SAM_CHECK, json.dumps(args)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def check_cp(args: list[str]) -> None:
    source, _ = args
    assert (REPO / source).is_file(), f"{source} does not exist"


def check_pytest(args: list[str]) -> None:
    for path in (a for a in args if not a.startswith("-")):
        assert (REPO / path).exists(), path


CHECKS = {
    "freeinference-batch": check_freeinference_batch,
    "make": check_make,
    "aws": check_aws,
    "sam": check_sam,
    "cp": check_cp,
    "pytest": check_pytest,
}


def test_the_readme_has_the_runbook_commands() -> None:
    programs = {Path(argv[0]).name for argv in COMMANDS}
    assert {"make", "sam", "aws", "freeinference-batch"} <= programs


@pytest.mark.parametrize("argv", COMMANDS, ids=_id)
def test_readme_command_parses(argv: list[str]) -> None:
    program = Path(argv[0]).name
    if program in UNCHECKED:
        return
    assert program in CHECKS, f"the README runs {argv[0]!r}, which this test cannot check: add a check"
    # Paths the README gives are the repo's own (.venv/bin/..., .tools/sam/bin/sam).
    if "/" in argv[0]:
        assert argv[0].startswith((".venv/bin/", ".tools/sam/bin/")), argv[0]
    CHECKS[program](argv[1:])


def test_a_misplaced_group_option_is_caught() -> None:
    # The README once had `admin create-key --stack-name ...`, which click refuses.
    with pytest.raises(click.NoSuchOption):
        parse_click(main, ["admin", "create-key", "--stack-name", "s", "--account", "a"])


_SAM_PROMPTS = """
import json
from samcli.commands.deploy.auth_utils import auth_per_resource
from samcli.lib.providers.sam_stack_provider import SamLocalStackProvider
stacks, _ = SamLocalStackProvider.get_stacks("template.yaml")
print(json.dumps([resource for resource, required in auth_per_resource(stacks) if not required]))
"""


def test_the_guided_deploy_table_is_what_sam_asks() -> None:
    # The runbook's table of `sam deploy --guided` prompts: the template's parameters in its
    # order (SAM asks for each), and the functions SAM asks to confirm have no authorizer.
    from freeinference_batch_local.cloudformation.template import load_template

    text = README.read_text()
    table = text.split("`sam deploy --guided` asks, in order:")[1].split("\n\n")[1]
    prompts = [row.split("|")[1].strip() for row in table.splitlines()[2:]]
    parameters = list(load_template(REPO / "template.yaml")["Parameters"])
    asked: list[str] = []
    for prompt in (p.removeprefix("Parameter ") for p in prompts if p.startswith("Parameter ")):
        if " … " in prompt:
            first, last = prompt.split(" … ")
            asked += parameters[parameters.index(first): parameters.index(last) + 1]
        else:
            asked += [name.strip() for name in prompt.split(",")]
    assert asked == parameters
    if not SAM_PYTHON.exists():
        pytest.skip("the SAM CLI is not installed (make install)")
    result = subprocess.run([str(SAM_PYTHON), "-c", _SAM_PROMPTS], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "SAM_CLI_TELEMETRY": "0"})
    assert result.returncode == 0, result.stderr
    unauthenticated = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert {f"{resource} has no authentication. Is this okay?" for resource in unauthenticated} <= set(prompts)
