# GNU make. `make help` lists the targets.
#
# Everything runs inside the virtual environment .venv/ at the repository root, which
# `make install` creates from the exact pins in requirements/lock.txt.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Prefix for any command that must find the venv's tools (jupyter, nbgrader, the `python3`
# kernel) before anything else on PATH: `$(VENV_PATH) some-command`.
VENV_PATH := PATH=$(CURDIR)/$(VENV)/bin:$$PATH

LOCK := requirements/lock.txt
STAMP := $(VENV)/.installed
# Dolos, the code-similarity engine of `coursepkg similarity`: Node.js packages pinned by the
# lock file in $(DOLOS_SRC), installed into the venv; npm ci writes the stamp.
DOLOS_SRC := coursepkg/grading/term/dolos
DOLOS := $(VENV)/dolos
DOLOS_STAMP := $(DOLOS)/node_modules/.package-lock.json
TORCH_VERSION := 2.13.0

# This machine keeps a CPU-only torch wheel in /opt/wheels. Always point pip at it when it is
# there: the torch wheel on PyPI for Linux is the multi-GB CUDA build.
WHEELS ?= /opt/wheels
PIP_FLAGS := --disable-pip-version-check $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
# The lock's wheels are installed by uv (pinned here, taken from PyPI into the venv by pip): it
# fetches, unpacks and compiles them in parallel, under a minute where pip took 4-5 minutes on two
# cores. Where uv cannot be had (an index without it) or fails, pip installs the lock as before.
# Both compile the packages' bytecode up front: left to the first import, the book's pages paid for
# it (its build took 698 s instead of about 570 in a fresh clone).
UV_VERSION := 0.13.9
UV_FLAGS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))

.PHONY: help install test test-fast lint format book pdf publish release lab bench robustness clean distclean lock

help:
	@echo "make install    create $(VENV)/ and install $(LOCK) and coursepkg (editable); no-op when up to date"
	@echo "make test       ruff check, ruff format --check, then pytest (the whole suite)"
	@echo "make test-fast  ruff, then the quick tests: package and checks, no browser/cluster/book/notebooks"
	@echo "make book       build the book (executes its pages) into _build/html/index.html"
	@echo "make pdf        the book as one PDF, _build/pdf/book.pdf (single-page HTML printed by headless chromium)"
	@echo "make lint       ruff check and ruff format --check"
	@echo "make format     ruff format and ruff check --fix"
	@echo "make publish    push the built book (_build/html) to the gh-pages branch (PUSH= for a local dry run)"
	@echo "make release    regenerate exercises/ (students' notebooks) from solutions/ with nbgrader"
	@echo "make lab        JupyterLab for students on exercises/ (COURSE_EXCHANGE=dir: on coursework/)"
	@echo "make bench      run benchmarks/run_all.py"
	@echo "make robustness run the book's trainings under 4 CPU settings; print each figure's spread"
	@echo "make clean      remove _build/ and tool caches (the venv stays)"
	@echo "make distclean  clean, and remove $(VENV)/ too"
	@echo "make lock       re-resolve the course environment and rewrite $(LOCK)"

install: $(STAMP) $(DOLOS_STAMP)

# The stamp lives inside the venv, so deleting .venv/ also forgets the install.
# Then coursepkg itself: --no-deps because the lock is the whole environment, and
# --no-build-isolation to build with the setuptools pinned in the lock rather than fetch another.
# `pip check` fails if pyproject.toml asks for something the lock does not provide.
# Then the course's Jupyter server extension is enabled in the venv (an editable install skips
# data files): it lets nbgrader's formgrader load MathJax without a network.
$(STAMP): $(LOCK) pyproject.toml
	@if [ -z "$(filter --find-links%,$(PIP_FLAGS))" ]; then \
	  echo "warning: $(WHEELS) not found; pip will take torch from the index you configured" \
	       "(on Linux, PyPI serves the large CUDA build)." >&2; fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(PIP_FLAGS) uv==$(UV_VERSION) \
	  && $(BIN)/uv pip install --python $(BIN)/python --compile-bytecode $(UV_FLAGS) -r $(LOCK) \
	  || { echo "make install: uv did not install $(LOCK) (why: above); pip installs it" >&2; \
	       $(BIN)/python -m pip install $(PIP_FLAGS) -r $(LOCK); }
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	install -D -m 644 jupyter/jupyter_server_config.d/coursepkg.json $(VENV)/etc/jupyter/jupyter_server_config.d/coursepkg.json
	touch $@

# Without npm the course still installs; only `coursepkg similarity` says what is missing.
# It needs nothing from the Python install, so `make -j2 install` (as .ci/run does) runs the two at
# once. JOBS=2: node-gyp compiles Dolos's tree-sitter grammars with two compilers at a time (about
# 1 minute instead of 2 on two cores).
$(DOLOS_STAMP): $(DOLOS_SRC)/package-lock.json $(DOLOS_SRC)/package.json
	@if command -v npm >/dev/null 2>&1; then \
	  mkdir -p $(DOLOS) && cp $(DOLOS_SRC)/package.json $(DOLOS_SRC)/package-lock.json $(DOLOS)/ && \
	  JOBS=2 npm ci --prefix $(DOLOS) --no-audit --no-fund; \
	else echo "warning: npm (Node.js 18+) not found: coursepkg similarity needs it" \
	  "(Debian: apt-get install nodejs npm, then make install again)" >&2; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# PYTEST_WORKERS (default 2): two pytest workers (pytest-xdist), one file each at a time (`--dist
# loadfile`: a module's expensive fixture, such as a graded class or a started JupyterLab, is built
# once, by the worker that runs the whole file; --no-loadscope-reorder keeps tests/conftest.py's
# order, longest files first, where xdist would hand out the files with the most tests first).
# Most of the slow tests wait on processes they started (kernels, nbgrader, Chromium,
# PostgreSQL, Dask, torchrun), so two at a time on 2 cores is what the machine can take; every
# test has to hold under that load anyway (DEVELOPING.md).
# The tests marked `serial` measure the whole machine (its shared memory, the graders' folders in
# /tmp), which the other worker would move: they run alone afterwards. PYTEST_WORKERS=0 runs all
# in one process. pytest exits 5 when it collects no test: tolerated for the serial part (it may
# select none), and for the rest only while tests/ holds no test file at all.
# The time budget (tests/budget.toml, tests/conftest.py): a budgeted test past twice its budget
# times the machine factor measured while it ran errors at its teardown, so `make test` fails
# there; its report ends with the budgeted tests against their budgets and the slowest tests
# without one. Every wait in the tests is bounded by progress or scaled by that factor
# (tests/fixtures/processes.py; COURSE_TIME_FACTOR=N fixes it).
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: lint
	@status=0; $(VENV_PATH) $(BIN)/python -m pytest -q $(XDIST) -m "not serial" || status=$$?; \
	if [ "$$status" -eq 5 ] && [ -z "$$(find tests -name 'test_*.py' -o -name '*_test.py' 2>/dev/null | head -n 1)" ]; then \
	  echo "make test: tests/ has no test files yet, so pytest collected nothing (exit 5); not counted as a failure."; \
	  status=0; \
	fi; \
	serial=0; $(VENV_PATH) $(BIN)/python -m pytest -q -m serial || serial=$$?; \
	if [ "$$serial" -ne 0 ] && [ "$$serial" -ne 5 ]; then status=$$serial; fi; \
	exit $$status

# The quick loop while editing the package or the checks: tests/reference/, tests/chapters/,
# tests/cli/, tests/grading/, tests/parallel/ and the layout rules, without the tests marked slow (real kernels, Dask,
# nbgrader batches, ranks started in processes of their own) and without
# the folders that build or drive the book, the notebooks, a browser or a cluster (tests/book/,
# tests/exercises/, tests/e2e/). DEVELOPING.md says which folder holds what.
FAST_TESTS := tests/test_layout.py tests/test_processes.py tests/test_budget.py tests/reference tests/interop tests/data tests/chapters tests/cli tests/posttrain tests/grading tests/parallel
test-fast: lint
	$(VENV_PATH) $(BIN)/python -m pytest -q $(XDIST) -m "not slow and not serial" $(FAST_TESTS)

# -W: warnings are errors; -n: nit-picky about missing references; --keep-going: report every
# warning before failing. Notebook outputs are cached in _build/.jupyter_cache (`make clean`
# forces every page to run again).
# BOOK_JOBS: pages are executed by this many processes at once (scripts/build_book.py: Jupyter Book's
# own build with Sphinx's parallel reading; 1 = one page after another).
# TQDM_MININTERVAL: progress bars in executed pages redraw at most every 30 s, so the static
# page shows a bar's start and end rather than hundreds of intermediate lines.
BOOK_JOBS ?= 2
book: install
	$(VENV_PATH) TQDM_MININTERVAL=30 BOOK_JOBS=$(BOOK_JOBS) $(BIN)/python scripts/build_book.py build . -W -n --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html"

# The book as one PDF, offline: Jupyter Book's single-page HTML build (from the same executed
# pages as `make book`: its cache in _build/.jupyter_cache; a page not in it runs now), printed
# by the system's headless Chromium (Debian: apt-get install chromium) into _build/pdf/book.pdf,
# with an outline of every heading and each figure's alt text. Nothing is downloaded.
pdf: install
	$(VENV_PATH) TQDM_MININTERVAL=30 $(BIN)/jupyter-book build . --builder singlehtml -n --keep-going
	$(BIN)/python scripts/book_pdf.py

# Publish the built book the usual Jupyter Book way: ghp-import commits the site to the gh-pages
# branch (--no-jekyll adds .nojekyll, so GitHub Pages serves _static/) and pushes it to origin.
# `make publish PUSH=` only commits the branch locally: a dry run to inspect with
# `git show gh-pages --stat`. It does not rebuild: run `make book` first.
SITE ?= _build/html
PUSH ?= --push
publish:
	@test -f $(SITE)/index.html || { echo "make publish: $(SITE)/index.html is missing; run \`make book\` first" >&2; exit 1; }
	$(BIN)/ghp-import --no-jekyll --force $(PUSH) --message "Publish the book" $(SITE)

# nbgrader's generate_assignment, in-process; records the assignments in gradebook.db (what
# nbgrader's release_assignment and autograde need); fails if a solution or a hidden test leaks
# into exercises/.
release: install
	$(VENV_PATH) $(BIN)/coursepkg release

# JupyterLab for students, with jupyter/student/ on JUPYTER_CONFIG_PATH: the student's nbgrader
# tools only, the book's chapters served at /static/book/ (after `make book`), the terminal with the venv on
# PATH. Without COURSE_EXCHANGE it opens exercises/; with it (the course's exchange folder) it
# opens coursework/, where the Assignment List fetches assignments (exercises/ already holds
# them). LAB_DIR= chooses another folder; LAB_ARGS= passes options to jupyter lab.
COURSE_EXCHANGE ?=
LAB_DIR ?= $(if $(COURSE_EXCHANGE),coursework,exercises)
LAB_ARGS ?=
lab: install
	@mkdir -p "$(LAB_DIR)"
	@test -f _build/html/index.html || echo "make lab: the book is not built, so the notebooks' links to it will not open; run \`make book\` first" >&2
	$(VENV_PATH) JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/student$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH} \
	  COURSE_EXCHANGE="$(COURSE_EXCHANGE)" $(BIN)/jupyter lab --notebook-dir="$(LAB_DIR)" $(LAB_ARGS)

bench: install
	@if [ -f benchmarks/run_all.py ]; then \
	  $(VENV_PATH) $(BIN)/python benchmarks/run_all.py; \
	else \
	  echo "make bench: benchmarks/run_all.py does not exist yet; nothing to run."; \
	fi

# The pages that train, executed under the default and the AVX2 kernels with 1 and 2 threads;
# prints every figure the pages glue into their prose, per setting, with its spread, and fails if
# the date translator drops below 99%. PAGES="08_training 09_decoding" runs only those pages;
# SETTINGS="default/2t,avx2/2t" only those of the four settings.
PAGES ?=
robustness: install
	$(VENV_PATH) $(BIN)/python scripts/robustness.py $(PAGES) $(if $(SETTINGS),--settings $(SETTINGS))

clean:
	rm -rf _build .pytest_cache .ruff_cache .hypothesis build coursepkg.egg-info

distclean: clean
	rm -rf $(VENV)

# Resolve the newest versions allowed by pyproject.toml (runtime deps plus the `course` and `dev`
# extras, with torch held at $(TORCH_VERSION)) in a throwaway venv, and pin all of them.
lock:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp" coursepkg.egg-info' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install $(PIP_FLAGS) "torch==$(TORCH_VERSION)" -e ".[course,dev,interop]"; \
	{ \
	  echo "# Exact pins of the whole course environment: coursepkg's dependencies plus its 'course',"; \
	  echo "# 'dev' and 'interop' extras (book, nbgrader, JupyterLab, tests, linting, Hugging Face transformers),"; \
	  echo "# for Python 3.11 on Linux x86_64."; \
	  echo "# \`make install\` installs this file into .venv/, then coursepkg itself (editable, --no-deps)."; \
	  echo "#"; \
	  echo "# Generated by \`make lock\` (do not edit by hand): it resolves pyproject.toml's ranges in a"; \
	  echo "# throwaway venv with torch==$(TORCH_VERSION) and runs \`pip freeze --all --exclude pip --exclude coursepkg\`."; \
	  echo "# torch is written without its local label (+cpu). Where /opt/wheels holds the CPU-only wheel,"; \
	  echo "# \`make install\` passes --find-links /opt/wheels and pip prefers $(TORCH_VERSION)+cpu to PyPI's CUDA build."; \
	  echo "# Python: $$("$$tmp/venv/bin/python" -c 'import platform; print(platform.python_version())')"; \
	  "$$tmp/venv/bin/python" -m pip freeze --all --exclude pip --exclude coursepkg \
	    | sed -E 's/^([A-Za-z0-9_.-]+==[^+]+)\+[A-Za-z0-9.]+$$/\1/'; \
	} > $(LOCK).tmp; \
	mv $(LOCK).tmp $(LOCK); \
	echo "Wrote $(LOCK) ($$(grep -c '==' $(LOCK)) pins)."
