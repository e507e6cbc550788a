"""`freeinference-batch`: the command line (entry point `freeinference_batch_client.cli:main`).

- `admin ...`  keys, accounts and model load (cli/admin.py), against a deployed stack, the local
  stack or the plain environment;
- `dev`        runs the local stack in the foreground (freeinference_batch_local.dev);
- user commands (submit, list, results, ...) come from cli/user.py, which registers them on
  `main` with `register(main)` when it exists.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

from freeinference_batch_client.cli import admin


@click.group(name="freeinference-batch")
@click.version_option(package_name="freeinference-batch")
def main() -> None:
    """FreeInference Batch: run batches of chat completions in the background."""


main.add_command(admin.admin)


@main.command()
@click.option("--verbose", is_flag=True,
              help="Every function's JSON log lines on the terminal, not only batch status changes and errors "
                   "(they are in .local-stack/logs/ either way).")
def dev(verbose: bool) -> None:
    """Run the whole service on this machine (moto, API, workers, schedules, simulated upstream)."""
    # Imported here: the local stack pulls in moto and the handlers, which no other command needs.
    from freeinference_batch_local.dev import run_local_stack

    run_local_stack(verbose=verbose)


# User commands live in their own module; register them once it exists.
if importlib.util.find_spec("freeinference_batch_client.cli.user") is not None:
    importlib.import_module("freeinference_batch_client.cli.user").register(main)
