# rescue — make targets. Every variable below can be set on the command line.
#
#   make demo     the main job: the arms on the embedded simulator (CPU, about a minute)
#   make test     the test suite (installs what it needs into .venv)
#   make lint     ruff, and shellcheck on launch/ when shellcheck is installed
#   make bench    the benchmarks in bench/, each printing side-by-side ratios

# PYTHON: the interpreter that creates the virtual environment (default python3).
PYTHON ?= python3
# VENV: the local virtual environment every target uses (default .venv).
VENV ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test lint bench identity venv clean

# One stamp per set of extras, so a target installs only what it needs, once.
$(VENV)/.stamp-base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

$(VENV)/.stamp-%: pyproject.toml $(VENV)/.stamp-base
	$(PIP) install -e '.[$(subst +,$(comma),$*)]'
	touch $@

comma := ,

venv: $(VENV)/.stamp-base

demo: $(VENV)/.stamp-sim
	$(PY) -m rescue identity

identity: $(VENV)/.stamp-base
	$(PY) -m rescue identity

test: $(VENV)/.stamp-dev+sim+swe+replay
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if command -v shellcheck >/dev/null 2>&1; then shellcheck launch/*.sh; \
	else echo "shellcheck not installed (apt-get install shellcheck): skipped"; fi

bench: $(VENV)/.stamp-dev+sim
	for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
