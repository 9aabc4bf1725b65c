"""MoE routing replay on a CUDA GPU: the Megatron engine (NCCL, one rank) on a toy Mixtral replays a given
routing in every MoE layer through megatron-core's RouterReplay, as tests/trainer/test_routing_replay.py and the
TP2xEP2 test check on CPU; here the router, the experts' dispatch and the replayed train step run on the GPU.

The engine runs in a subprocess (its process group, its CUDA context), with `dist_worker.replay_script`, the
script the four-rank CPU test runs: log-probs without and with the batch's routing, the routing map each
router produced in the replayed forward, then a replayed train step.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import dist_worker
import pytest
import torch
from tiny_models import make_tiny_hf_model

pytestmark = [pytest.mark.gpu, pytest.mark.megatron]

TRAINER_TESTS = Path(__file__).parents[1] / "trainer"
SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[3])
import dist_worker
out = dist_worker.replay_script(sys.argv[1])
torch.save({"plain": out["plain"].cpu(), "replayed": out["replayed"].cpu(), "train": out["train"],
            "maps": {k: v.cpu() for k, v in out["maps"].items()}, "maps_device": str(out["maps"][0].device),
            "cuda_peak": torch.cuda.max_memory_allocated()}, sys.argv[2])
"""


def test_routing_replay_on_cuda(tmp_path: Path) -> None:
    from tandem.sidecars.trainer.engines.routing_replay import targets

    model = make_tiny_hf_model(tmp_path / "mixtral", family="mixtral")
    out_file = tmp_path / "replay.pt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(out_file), str(TRAINER_TESTS)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    seen: dict[str, Any] = torch.load(out_file)
    # the routers ran on the GPU (their maps are CUDA tensors), and so did the model (CUDA memory allocated)
    assert seen["maps_device"].startswith("cuda") and seen["cuda_peak"] > 0, seen["maps_device"]
    routed = dist_worker.replay_batch()["routed_experts"]
    want = targets(routed, routed.shape[1], 1, 0, False)  # one rank: every position of both rows, in order
    assert sorted(seen["maps"]) == [0, 1]
    for layer, got in seen["maps"].items():
        expected = torch.zeros(want.shape[0], 4, dtype=torch.bool).scatter_(1, want[:, layer], True)
        assert torch.equal(got.to(torch.bool), expected), layer
    assert (seen["replayed"] - seen["plain"]).abs().max() > 1e-3, "the random routing changes the log-probs"
    assert torch.isfinite(torch.tensor(seen["train"]["loss"])) and seen["train"]["grad_norm"] > 0
