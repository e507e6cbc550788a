.PHONY: install test dev build lint

PYTHON ?= python
SAM := .tools/sam/bin/sam
# sam build looks for python3.13 on PATH; this makes the pyenv shim resolve it.
SAM_PYENV_VERSION ?= 3.11.7:3.13.0

install: $(SAM)
	$(PYTHON) -m venv .venv && .venv/bin/pip install -e '.[dev]'

test:
	.venv/bin/pytest -q

dev:
	.venv/bin/freeinference-batch dev

# aws-sam-cli lives in its own venv so its pins never fight the project's.
$(SAM):
	$(PYTHON) -m venv .tools/sam && .tools/sam/bin/pip install aws-sam-cli

build: $(SAM)
	PYENV_VERSION=$(SAM_PYENV_VERSION) SAM_CLI_TELEMETRY=0 $(SAM) build --template-file template.yaml

lint:
	.venv/bin/ruff check .
	.venv/bin/cfn-lint template.yaml
