"""The GPU checks (`pytest -m gpu`, run by scripts/gpu-check.sh on a CUDA machine): every test here is
marked `gpu` and skipped, naming why, where torch sees no CUDA device (`gpu_record.py` writes the
rows of the script's table)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))  # tiny_model
sys.path.insert(0, str(Path(__file__).parents[1] / "trainer"))  # pipeline_worker, dist_worker


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    from tandem.sidecars.gpu import describe

    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {describe()}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
