"""bfloat16 end to end on CPU, as `trainer.dtype: bfloat16` runs it: the real Megatron engine in bf16
(Float16Module) takes two training steps and exports its weights as a published version (bf16 tensors,
the checkpoint engine's own writer); a vLLM (CPU) engine started in bf16 loads it in place through the
validated update path and decodes greedily what transformers decodes in bf16 from the same version's HF
export (identical, or diverging only at a bf16 near-tie of transformers' logits). vLLM's check converts
nothing: a float32 copy of the version is refused naming the dtype.

The trainer runs in a subprocess (tests/trainer/pipeline_worker.py), as in test_trainer_to_vllm.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import tiny_model
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import layout, version_writer
from tandem.checkpoint_engine.versions.hf_export import export_version
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.vllm, pytest.mark.megatron]

WORKER = Path(__file__).parents[1] / "trainer" / "pipeline_worker.py"
PROMPTS = ["alpha beta gamma", "one two three four", "sigma tau 7", "omega psi chi", "nine 41 delta"]
NEW_TOKENS = 8
# vLLM's CPU kernels (incremental decode over a bf16 KV cache) and transformers (full forwards) round bf16
# differently: where transformers' two best logits are within a few bf16 ulps of each other, either may win
# (measured here: 39 of 40 tokens identical; prompt 0's 8th went the other way, transformers' lead 0.19).
TIE_ULPS = 4


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    for prompt in prompts:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        out.append(ids[len(prompt):])
    return out


def test_bf16_train_publish_and_vllm_decode_like_transformers(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tmp_path / "model"
    tiny_model.random_model(seed=7).save_pretrained(model_dir)
    tiny_model.build_tokenizer(model_dir)
    prompts = [AutoTokenizer.from_pretrained(model_dir)(p).input_ids for p in PROMPTS]
    shm = Path("/dev/shm") / f"tandem-bf16-{uuid.uuid4().hex[:8]}"
    shm.mkdir()
    spec = [{"model_dir": str(model_dir), "shm_root": str(shm), "job": "bf16", "prompts": prompts,
             "max_new_tokens": NEW_TOKENS, "out": str(tmp_path / "bf16.pt"), "dtype": "bfloat16"}]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    engine = RolloutEngine(EngineConfig(shm_root=shm, job="bf16", max_model_len=256, dtype="bfloat16"))
    try:
        proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "spec.json")], capture_output=True,
                              text=True, timeout=600, cwd=WORKER.parent)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        trainer = torch.load(tmp_path / "bf16.pt", weights_only=False)
        losses = trainer["losses"]
        assert losses[-1] < losses[0], f"bf16 training did not lower the loss: {losses}"
        v1 = Path(trainer["v1"]["path"])
        dtypes = {t.dtype for _, t in layout.MappedVersion(v1).tensors()}
        assert dtypes == {torch.bfloat16}, f"the bf16 trainer published {dtypes}"

        engine.start(str(model_dir), dummy=True)
        assert str(engine.llm.llm_engine.model_config.dtype) == "torch.bfloat16"
        report = engine.update_from_path(v1)
        assert report.version == 1
        got = [c[0].token_ids for c in engine.generate(prompts, SamplingOptions(temperature=0.0,
                                                                               max_tokens=NEW_TOKENS,
                                                                               ignore_eos=True))]
        hf_dir = export_version(v1, model_dir, tmp_path / "hf-v1", dtype=torch.bfloat16)
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).eval()
        assert next(hf.parameters()).dtype == torch.bfloat16
        want = hf_greedy(hf, prompts)
        same = sum(g == w for g, w in zip(got, want, strict=True))
        assert same >= len(prompts) - 1, f"vLLM (bf16) decodes unlike transformers (bf16): {got} vs {want}"
        for prompt, g, w in zip(prompts, got, want, strict=True):  # a divergence may only be a bf16 near-tie
            if g != w:
                k = next(i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b)
                with torch.no_grad():
                    logits = hf(torch.tensor([prompt + w[:k]])).logits[0, -1].float()
                margin = float(logits[w[k]] - logits[g[k]])
                tie = TIE_ULPS * torch.finfo(torch.bfloat16).eps * float(logits[w[k]].abs())
                assert k > 0 and margin < tie, (f"vLLM chose {g[k]} at step {k} where transformers' {w[k]} "
                                                f"(logit {float(logits[w[k]]):.3f}) leads by {margin:.4f}: more "
                                                f"than a bf16 near-tie ({TIE_ULPS} ulps, {tie:.4f})")
        assert got != hf_greedy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval(),
                                prompts), "the two bf16 training steps must change some greedy continuation"

        fp32 = version_writer.write_version(shm, "bf16-as-fp32", 2, ((n, t.float()) for n, t in
                                                              layout.MappedVersion(v1).tensors()))
        with pytest.raises(errors.CheckpointEngineError, match="dtype float32 != expected bfloat16"):
            engine.update_from_path(fp32.path)
        assert engine.version == 1, "a refused version leaves the loaded one serving"
    finally:
        engine.terminate()
        shutil.rmtree(shm, ignore_errors=True)


def _has_amx() -> bool:
    return "amx_tile" in Path("/proc/cpuinfo").read_text()


@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX tiles: vLLM's bf16 kernels never use them here")
def test_a_vllm_worker_holds_the_amx_state_before_its_first_kernel() -> None:
    """Linux clears AMX permission at exec, so a fresh worker has none until something asks; the extension
    module vLLM imports in each worker asks, so vLLM's AMX attention cannot die with SIGILL (exit -4)."""
    probe = ("import ctypes; libc = ctypes.CDLL(None); v = ctypes.c_ulong(0)\n"
             "def perm():\n    libc.syscall(158, 0x1022, ctypes.byref(v)); return bool(v.value & (1 << 18))\n"
             "before = perm()\nimport tandem.sidecars.rollout_engine.worker.shm_loader\nprint(before, perm())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
