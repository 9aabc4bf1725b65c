"""The GPU path, on a CUDA machine (scripts/gpu-check.sh; skipped elsewhere, naming why):

* Megatron in bf16 trains, offloads (its GPU memory drops to a small share), onloads and trains again;
  torch.cuda.max_memory_allocated of every phase is recorded; the hf engine (FSDP2, bf16 compute over fp32
  master weights) does the same;
* vLLM on CUDA in bf16 with CUDA graphs and sleep mode: starts with dummy weights, loads the bf16
  version the Megatron trainer published in place, decodes greedily what transformers (bf16, CUDA)
  decodes (a divergence only at a bf16 near-tie), sleeps at level 2 (weights dropped), wakes, loads
  the version again and decodes the same, and terminates.
The trainer runs in subprocesses (tests/gpu/memory_worker.py, tests/trainer/pipeline_worker.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import tiny_model
import torch
from gpu_record import record

from tandem.checkpoint_engine.versions.hf_export import export_version
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.gpu, pytest.mark.megatron, pytest.mark.vllm]

HERE = Path(__file__).parent
PROMPTS = ["alpha beta gamma", "one two three four", "sigma tau 7", "omega psi chi", "nine 41 delta"]
NEW_TOKENS = 8
TIE_ULPS = 4  # bf16 ulps within which vLLM's and transformers' kernels may pick either of two tokens


def model(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    tiny_model.random_model(seed=7).save_pretrained(d)
    tiny_model.build_tokenizer(d)
    return d


@pytest.mark.parametrize("engine", ["megatron", "hf"])
def test_bf16_train_offload_onload(tmp_path: Path, engine: str) -> None:
    out = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, str(HERE / "memory_worker.py"), str(model(tmp_path)), str(out), engine],
                          capture_output=True, text=True, timeout=600, cwd=HERE.parent / "trainer")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.read_text())
    phases = result["phases"]
    for name, m in phases.items():
        record(f"{engine} {name}", peak_mib=round(m["peak_mib"], 1), allocated_mib=round(m["allocated_mib"], 1),
               cublas_workspaces_mib=round(m["cublas_workspaces_mib"], 1))
    # Megatron keeps bf16 weights (fp32 main copies in its optimizer); FSDP2 keeps fp32 and computes in bf16
    assert ("torch.bfloat16" if engine == "megatron" else "torch.float32") in result["dtypes"], result["dtypes"]
    assert all(x == x for x in result["losses"]) and result["losses"][1] < result["losses"][0], result["losses"]
    trained = phases["train"]["allocated_mib"]
    assert phases["offload"]["allocated_mib"] < 0.25 * trained, phases  # weights and optimizer left the GPU
    assert phases["onload"]["allocated_mib"] > 0.5 * trained, phases  # and came back


def greedy_hf(hf: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    for prompt in prompts:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                ids.append(int(hf(torch.tensor([ids], device="cuda")).logits[0, -1].argmax()))
        out.append(ids[len(prompt):])
    return out


def assert_greedy_alike(got: list[list[int]], want: list[list[int]], hf: torch.nn.Module,
                        prompts: list[list[int]]) -> None:
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= len(prompts) - 1, (got, want)
    for prompt, g, w in zip(prompts, got, want, strict=True):
        if g != w:
            k = next(i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b)
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + w[:k]], device="cuda")).logits[0, -1].float()
            tie = TIE_ULPS * torch.finfo(torch.bfloat16).eps * float(logits[w[k]].abs())
            assert k > 0 and float(logits[w[k]] - logits[g[k]]) < tie, (g, w, k)


def test_vllm_cuda_update_sleep_wake_greedy(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = model(tmp_path)
    prompts = [AutoTokenizer.from_pretrained(model_dir)(p).input_ids for p in PROMPTS]
    shm = Path("/dev/shm") / f"tandem-gpu-{uuid.uuid4().hex[:8]}"
    shm.mkdir()
    spec = [{"model_dir": str(model_dir), "shm_root": str(shm), "job": "gpu", "prompts": prompts,
             "max_new_tokens": NEW_TOKENS, "out": str(tmp_path / "trainer.pt"), "dtype": "bfloat16"}]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    engine = RolloutEngine(EngineConfig(shm_root=shm, job="gpu", max_model_len=256, dtype="bfloat16",
                                        gpu_memory_utilization=0.3, enforce_eager=False, enable_sleep_mode=True))
    try:
        worker = HERE.parent / "trainer" / "pipeline_worker.py"
        proc = subprocess.run([sys.executable, str(worker), str(tmp_path / "spec.json")], capture_output=True,
                              text=True, timeout=600, cwd=worker.parent)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        v1 = Path(torch.load(tmp_path / "trainer.pt", weights_only=False)["v1"]["path"])
        timings = engine.start(str(model_dir), dummy=True)
        record("vllm start (CUDA graphs)", seconds=round(timings["start_total_s"], 1))
        report = engine.update_from_path(v1)
        record("vllm in-place update", seconds=round(report.total_s, 3))
        greedy = SamplingOptions(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        got = [c[0].token_ids for c in engine.generate(prompts, greedy)]
        hf_dir = export_version(v1, model_dir, tmp_path / "hf", dtype=torch.bfloat16)
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).cuda().eval()
        assert_greedy_alike(got, greedy_hf(hf, prompts), hf, prompts)

        t = time.perf_counter()
        engine.sleep(2)
        engine.wake_up()
        assert engine.version is None, "level 2 drops the weights: a version must be loaded after waking"
        engine.update_from_path(v1)
        record("vllm sleep 2 + wake + update", seconds=round(time.perf_counter() - t, 3))
        assert [c[0].token_ids for c in engine.generate(prompts, greedy)] == got
    finally:
        t = time.perf_counter()
        engine.terminate()
        record("vllm terminate", seconds=round(time.perf_counter() - t, 3))
        shutil.rmtree(shm, ignore_errors=True)
