# Two commands do all set-up on a fresh machine with Python 3.11:
#   make demo   - a local node with a subscriber and a publisher
#   make test   - ruff, mypy and pytest (installs Java 17 for Spark if it is missing)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Roost needs Python >= 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python scripts/netns.py ensure-tools --best-effort
	@# Spark (the audit, the roost data source) needs Java 17 or later.
	@$(BIN)/python -c 'import sys; from roost.pipeline.spark import java_major; sys.exit((java_major() or 0) < 17)' || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Java 17 for Spark: apt-get install openjdk-17-jre-headless"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
		else echo "Spark needs Java 17: install openjdk-17-jre-headless (as root: apt-get install -y" \
			"openjdk-17-jre-headless) and run make again"; exit 1; fi; }
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/ruff check roost client node cluster pipeline sim scripts tests examples
	$(BIN)/ruff format --check roost client node cluster pipeline sim scripts tests examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	@# The tests that share the machine's firewall, namespaces or chaos runs alone, then the rest in
	@# two processes (tests/conftest.py says which and why); plain `pytest` runs all in one. Work
	@# stealing: a process that runs out takes tests queued for the other, so a long Spark test near
	@# the end does not leave one core idle (5 min 13 s against 6 min 1 s, 2026-11-29).
	$(BIN)/pytest -m alone --durations=5
	$(BIN)/pytest -m "not alone" -n 2 --dist worksteal --durations=15

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
