# `make demo` runs the main job, `make test` the whole suite. Both create .venv
# and install the pinned dependencies first; nothing else is needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/fedmask demo

bench: setup
	$(PY) -m secagg.bench --clients 100 --dim 53824 --neighbors all --dropout 0.1 --dropout-stage unmasking --seed 0

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
