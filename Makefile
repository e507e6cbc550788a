.PHONY: install test dev build lint bench

PYTHON ?= python3
SAM := .tools/sam/bin/sam
VENV := .venv/.installed
# sam build looks for python3.13 on PATH; this makes the pyenv shim resolve it.
SAM_PYENV_VERSION ?= 3.11.7:3.13.0

# The project venv (runtime + local stack + test tools), rebuilt when pyproject.toml changes.
$(VENV): pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[dev]'
	touch $@

# aws-sam-cli lives in its own venv so its pins never fight the project's.
$(SAM):
	$(PYTHON) -m venv .tools/sam
	.tools/sam/bin/pip install -q aws-sam-cli

# The security scanners (tests/deploy/test_security_scans.py) in their own venv too: checkov pins
# packaging<24, which the project's pytest refuses, and brings a few hundred MB.
SCANNERS := .tools/security/.installed
$(SCANNERS):
	$(PYTHON) -m venv .tools/security
	.tools/security/bin/pip install -q checkov bandit
	touch $@

# The console's browser tests (tests/e2e/test_console.py) drive Debian's Chromium through its
# ChromeDriver: installed from the distribution's packages, never downloaded by a test at run time.
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(CHROMEDRIVER):
	$(SUDO) apt-get update -q
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium chromium-driver

install: $(VENV) $(SAM) $(SCANNERS) $(CHROMEDRIVER)

test: install
	.venv/bin/pytest -q

# VERBOSE=1 make dev: every function's JSON log lines on the terminal (README, "A quiet make dev").
dev: $(VENV)
	@.venv/bin/freeinference-batch dev $(if $(filter 1,$(VERBOSE)),--verbose)

build: $(SAM)
	PYENV_VERSION=$(SAM_PYENV_VERSION) SAM_CLI_TELEMETRY=0 $(SAM) build --template-file template.yaml

lint: $(VENV)
	.venv/bin/ruff check .
	.venv/bin/cfn-lint template.yaml model/template.yaml monitoring/template.yaml

bench: $(VENV)
	.venv/bin/python bench/create_and_read.py
