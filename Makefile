# The two commands a newcomer needs: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test` (TEST_WORKERS=0: one process, as plain `pytest` runs)
TEST_WORKERS ?= 2

.PHONY: serve test setup lint chat docs docs-write clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench,postgres,cluster,docs]'
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/pagedchat serve

chat: $(STAMP)
	$(VENV)/bin/pagedchat chat

# the documentation site, offline, strict (a broken link, anchor or missing page fails): build/site/index.html
docs: $(STAMP)
	$(PY) scripts/build_docs.py

# rewrite the pages' options blocks from the settings' declarations (the build fails while one is stale), then build
docs-write: $(STAMP)
	$(PY) scripts/build_docs.py --write

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# pytest writes bytecode caches even where the environment says PYTHONDONTWRITEBYTECODE: else both workers, every
# server and Ray worker the tests start compile the project from source, and pytest rewrites every test module's
# asserts again in each process (collection 19 s -> 8 s a worker)
test: $(STAMP)
	bash scripts/setup_test_deps.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build/site docs/operators/configuration-reference.md
