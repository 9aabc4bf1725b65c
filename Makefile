# Entry points. Both install what they need (scripts/setup.sh caches everything under ~/.cache/tandem).
VENV ?= $(HOME)/.cache/tandem/venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint crd
setup:
	scripts/setup.sh all

demo: setup
	$(VENV)/bin/tandem run examples/tiny-grpo.yaml

test: setup
	scripts/test.sh

lint:
	$(VENV)/bin/ruff check operator sidecars checkpoint_engine tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

crd:
	$(VENV)/bin/tandem crd --write
