# cryptotrain — every workflow is one make target. `make help` lists them.
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
CLI     = $(VENV)/bin/cryptotrain
# TensorFlow: a default dependency; where an NVIDIA driver is present the gpu extra adds CUDA (TF_EXTRA=cpu|gpu).
TF_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
comma   := ,
EXTRAS   = dev,ray$(if $(filter gpu,$(TF_EXTRA)),$(comma)gpu)
FAMILIES = v7 v8_stable v8_aligned
# Made by a successful install; every target that runs the project depends on it, so `make demo` or `make test`
# from a bare clone installs first, and a second call does not install again (unless pyproject.toml changed).
STAMP   = $(VENV)/.installed-$(TF_EXTRA)

.PHONY: help install check-install test test-all test-fast demo train-all bench bench-features bench-run bench-throughput bench-skill bench-baselines bench-ray bench-pack bench-family lint clean

help:            ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: $(STAMP) ## venv + dependencies + the package (editable), TF_EXTRA=cpu|gpu to force a build

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# tensorflow-cpu (what earlier versions installed) and tensorflow both provide the module: never side by side
	$(PY) -m pip uninstall --quiet --yes tensorflow-cpu 2>/dev/null || true
	@# pip would byte-compile what it installs one file at a time (TensorFlow, JAX, Ray: ~14,000 files); compileall
	@# spreads that over every core: the whole install took 66-70 s instead of 71-77 on 2 cores (2026-11-30, side by
	@# side). Files that do not compile are left to be compiled when imported, as pip leaves them. Not the packages'
	@# own tests (2,100 files no one imports); and the checkout's trainer/ too, which an editable install leaves
	@# uncompiled: where PYTHONDONTWRITEBYTECODE is set (many containers), every process compiled it anew (0.1 s of
	@# CPU each; an edited file is compiled anew when imported, as before).
	$(PY) -m pip install --quiet --no-compile -e ".[$(EXTRAS)]"
	$(PY) -m compileall -qq -j 0 -x 'site-packages/.+/tests?/' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" trainer || true
	@$(CLI) --version
	@touch $@

check-install:   ## what a user gets: a fresh venv, a plain `pip install` of this checkout (no extras), the quickstart
	@# From another directory: the bundled config and candles come from the installed package.
	set -e; dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	$(PYTHON) -m venv "$$dir/venv"; \
	"$$dir/venv/bin/python" -m pip install --quiet --upgrade pip; \
	"$$dir/venv/bin/python" -m pip install --quiet "$(CURDIR)"; \
	cd "$$dir"; venv/bin/cryptotrain run --config quickstart --set train.epochs=1 --tensorboard; \
	venv/bin/cryptotrain status runs/quickstart

# pytest-xdist workers for `make test`: three for every two cores, at least 2, at most 8. The suite waits on the
# processes it starts (runs it kills, Ray) part of the time, but is CPU-bound: on 2 cores (Intel Xeon, 2026-11-29,
# side by side) 2 workers took 443 s, 3 took 440 s, 4 took 479 s (each a TensorFlow more, and the cores shared by
# more). Each worker holds ~2.5 GB. The session's trained run and fork server are shared by the workers.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(8, max(2, 3 * len(os.sched_getaffinity(0)) // 2)))")

test: $(STAMP)   ## the suite: tiny configs, real components, the bundled candles; all but the bench tier (~7 min on 2 cores)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not bench"

test-all: $(STAMP) ## the suite and the bench tier: every benchmark that trains, run at its least size (what CI runs)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-fast: $(STAMP) ## the unit tier: no training, no TensorFlow process started, no Ray (~45 s; CONTRIBUTING.md)
	$(PY) -m pytest -q -n auto --dist worksteal -m "not train and not processes"

demo: $(STAMP)   ## train the quickstart config end to end (offline, real bundled candles, under a minute on CPU)
	$(CLI) run --config configs/quickstart.yaml

train-all: $(STAMP) ## train the three model families in turn (40 jobs each); ARGS="--only BTC*" to narrow
	@# Failed jobs in one family do not stop the next family (exit 1 at the end); bad input (2) stops at once.
	@status=0; for family in $(FAMILIES); do \
	  $(CLI) run --config configs/$$family.yaml $(ARGS) || { status=$$?; [ $$status -ne 2 ] || exit 2; }; \
	done; exit $$status

bench: bench-features bench-run bench-throughput bench-skill bench-baselines bench-ray bench-pack bench-family  ## all benchmarks

bench-features: $(STAMP) ## data preparation: old loop-based way vs ours cold vs ours cached
	$(PY) benchmarks/bench_features.py

bench-run: $(STAMP) ## N tiny jobs: old per-job scripts vs `cryptotrain run`
	$(PY) benchmarks/bench_run.py

bench-throughput: $(STAMP) ## training samples/s and achieved GFLOP/s per family shape
	$(PY) benchmarks/bench_throughput.py

bench-skill: $(STAMP) ## the V7 family on the 48 real series vs HAR + time of day: range, excursions, interval (~10 min)
	$(PY) benchmarks/bench_skill.py

bench-baselines: $(STAMP) ## the baselines a quant tries first (EWMA, HAR + time of day, intervals) on every real series (seconds)
	$(PY) benchmarks/bench_baselines.py

bench-ray: $(STAMP) ## the same 8 real-data jobs: one local process vs 2 single-threaded Ray workers
	$(PY) benchmarks/bench_ray.py

bench-pack: $(STAMP) ## packed training (JAX) vs one job at a time: samples/s of a family's step, K jobs a step
	$(PY) benchmarks/bench_pack.py $(ARGS)

bench-family: $(STAMP) ## a family's `cryptotrain run` end to end, its phases (prepare, compile, train, evaluate); ARGS="--family v7 --epochs 3"
	$(PY) benchmarks/bench_family.py $(ARGS)

lint: $(STAMP)   ## ruff
	$(VENV)/bin/ruff check trainer tests benchmarks

clean:           ## remove runs/ and caches (keeps the venv)
	rm -rf runs .pytest_cache .ruff_cache
