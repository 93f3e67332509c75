# Spate developer commands. `make demo` and `make test` work on a fresh machine: they install
# what they need first (tools/bootstrap.sh).
VENV   := .venv
PY     := $(VENV)/bin/python
SEEDS  ?= 200
SCHEDULE ?= standard
SEED   ?= 1
MINUTES ?=
MODEL  ?= all
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test test-long test-all check fmt bench sim chaos image test-image install proto clean help

help:
	@echo "make demo   - install, start a local Spate cluster, publish and consume over AMQP 1.0"
	@echo "make test   - install and run the test suite but the longest scenarios (TEST_WORKERS=2 processes)"
	@echo "make test-long - the longest kill/restart scenarios (marker long; CI runs both); make test-all: both"
	@echo "make check  - ruff, mypy --strict on src/, import contracts, stale generated code"
	@echo "make fmt    - format and autofix with ruff"
	@echo "make bench  - run the benchmarks in benchmarks/ and print figures"
	@echo "make sim    - run the deterministic simulators over SEEDS seeds (MODEL=all|shell|core|metadata|groups|pysyncobj)"
	@echo "make image  - build the container image localhost/spate:latest as root (deploy/build-image.sh)"
	@echo "make test-image - build it, run 3 nodes and a gateway from it, publish and consume (root)"
	@echo "make chaos  - a chaos run as root: SCHEDULE (standard, 10 min) with SEED=1; report in chaos/reports/"

install:
	@bash tools/bootstrap.sh

proto: install
	@PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) tools/gen_proto.py

demo: install
	@$(PY) -m spate.cli.demo

# Two pytest-xdist workers: most tests wait on real processes and timers, so two run in about
# half the time on CI's two cores. loadgroup keeps each `xdist_group` (the Spark stage's one
# JVM) on one worker. `make test TEST_WORKERS=0` runs serially; PYTEST_ARGS comes last and wins.
# The longest kill/restart scenarios (marker `long`, 15-50 s each) are a tier of their own,
# `make test-long`, which .ci/run runs after `make test`; `make test-all` runs both.
TEST_WORKERS ?= 2
PYTEST = $(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup
test: install
	$(PYTEST) -m "not long" $(PYTEST_ARGS)

test-long: install
	$(PYTEST) -m long $(PYTEST_ARGS)

test-all: test test-long

check: install
	$(VENV)/bin/ruff check src tests benchmarks tools chaos
	$(VENV)/bin/ruff format --check src tests benchmarks tools chaos
	@mkdir -p build/typing && ln -sfn ../../src build/typing/spate
	MYPYPATH=build/typing $(VENV)/bin/mypy -p spate
	MYPYPATH=build/typing $(VENV)/bin/mypy chaos
	$(VENV)/bin/lint-imports
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) tools/gen_proto.py --check

fmt: install
	$(VENV)/bin/ruff format src tests benchmarks tools chaos
	$(VENV)/bin/ruff check --fix src tests benchmarks tools

bench: install
	$(PY) benchmarks/run_all.py

sim: install
	$(PY) -m spate.sim --model $(MODEL) --seeds $(SEEDS)

chaos: install
	$(PY) -m chaos run --schedule $(SCHEDULE) --seed $(SEED) $(if $(MINUTES),--minutes $(MINUTES))

# The container image (docs/deploy.md "Container image"): podman, the base image made from
# Debian's archive with mmdebstrap when missing. SPATE_IMAGE names the tag.
image:
	bash deploy/build-image.sh

test-image: install
	bash deploy/test-image.sh

clean:
	rm -rf $(VENV) build *.egg-info src/api/v1 tests/js/node_modules
