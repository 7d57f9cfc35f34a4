# The README's two commands: `make demo` (the main job) and `make test` (the suite CI runs).
# Both do all set-up on a fresh machine: virtualenv in .venv, pinned install, demo checkpoint.
VENV ?= .venv
PY := $(VENV)/bin/python
VELA2 := $(VENV)/bin/vela2
DEMO_CKPT ?= .cache/vela2-demo

.PHONY: install demo test test-fast lint bench-queue reliability soak clean dist

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt "torch==2.13.0"
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# rebuilt when the demo's recipe or data (vela2/train) changes, not only when missing
$(DEMO_CKPT)/config.json: $(VENV)/.installed $(wildcard vela2/train/*.py)
	$(VELA2) init-demo $(DEMO_CKPT)

demo: $(DEMO_CKPT)/config.json
	$(VELA2) demo --checkpoint $(DEMO_CKPT)

lint: install
	$(VENV)/bin/ruff check vela2 worker producer stack bench tests
	$(VENV)/bin/mypy

# The docs site (strict: a broken link or anchor, or a page outside the nav, fails it; never --quiet,
# which hides the warnings strict fails on; built into site/, git-ignored; NO_MKDOCS_2_WARNING silences
# mkdocs-material's banner about its successor), then the
# whole suite over TEST_WORKERS processes (pytest-xdist); the demo model is trained once per
# version of vela2/ and kept in ~/.cache/vela2-tests (tests/conftest.py).
TEST_WORKERS ?= 4
test: lint
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	$(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal tests

# The fast lane: the unit tests (no process started; tests/unit), no lint.
test-fast: install
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 2 tests/unit

# The fault suite against real processes (bench/faults; writes bench/results/reliability.json; exit 1 on a
# lost request).
# RELIABILITY_ARGS adds options, e.g. the repeat run under load:
#   make reliability RELIABILITY_ARGS="--only redis_down --repeat 3 --cpu-hog 1 --fuzz-examples 0" \
#        RELIABILITY_OUT=bench/results/reliability-repeat.json
RELIABILITY_OUT ?= bench/results/reliability.json
RELIABILITY_ARGS ?=
reliability: $(DEMO_CKPT)/config.json
	$(PY) -m bench.faults --checkpoint $(DEMO_CKPT) --out $(RELIABILITY_OUT) $(RELIABILITY_ARGS)

# Steady traffic for MINUTES minutes, sampling worker RSS and GPU memory (bench/results/soak.json).
MINUTES ?= 5
soak: $(DEMO_CKPT)/config.json
	$(PY) -m bench.faults --checkpoint $(DEMO_CKPT) --only none --fuzz-examples 0 \
		--soak-minutes $(MINUTES) --out bench/results/soak.json

# The sdist and the wheel in dist/ (python -m build; the wheel is built from the sdist, so the sdist
# is complete): pip install "dist/vela2-<version>-py3-none-any.whl[producer]" -c constraints.txt
dist: install
	rm -rf dist
	$(PY) -m build --outdir dist .

# Queue overhead on this CPU machine vs plain Celery (writes bench/results/cpu-queue.json).
bench-queue: $(DEMO_CKPT)/config.json
	$(PY) -m bench.queue_bench cpu --cpu-processes 1 --out bench/results/cpu-queue.json

clean:
	rm -rf $(VENV) .cache
