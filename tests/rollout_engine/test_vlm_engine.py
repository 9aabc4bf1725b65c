"""A vision-language model through the rollout engine: a version with transformers' names loads into vLLM, and
pictures sent as on the wire reach the model.

The VLM demo's builder on the tiny Qwen2 (tiny_model.py) as the language model; real etcd, a real publisher and
vLLM-CPU. The engine starts with dummy weights (its parameter check reads the VLM's names: tower and projector
included); version 1 is the state of a transformers LLaVA whose tower and projector were re-drawn, published
under transformers' in-memory names (`model.vision_tower.embeddings...`), which the worker's loader renames to
vLLM's layout (checkpoint_engine/versions/tower_names.py). With a tied language model (SmolLM2's kind) the version
carries no head, as the trainer publishes it, and the loader ties the language model's head to the new embedding
(it used to look for the head at the model's root: a tied LLaVA served its dummy head).
Asserted: the engine's greedy completions of three picture prompts (sent
through `encode_image` / `decode_images`, as the rollout sidecar receives them) equal transformers' greedy
decoding of that same model, token for token; the prompt ids vLLM reports carry each picture's image tokens;
and a different picture changes the log-probs (the picture reaches the model).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import tiny_model
import torch

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.sidecars.rollout_engine.contract import decode_images, encode_image
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.sidecars.vlm_demo import build, shapes, warmup

GREEDY = SamplingOptions(temperature=0.0, max_tokens=6, min_tokens=6)


def redrawn(model_dir: Path, out: Path) -> Any:
    """The LLaVA of model_dir with its tower and projector drawn again (seed 9), saved to `out` too."""
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(9)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("model.vision_tower.", "model.multi_modal_projector.")) and p.dim() >= 2:
                p.normal_(0.0, 0.05)
    build.save(model, out)
    for f in model_dir.iterdir():
        if not (out / f.name).exists():
            (out / f.name).write_bytes(f.read_bytes())
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_vlm_version_loads_and_pictures_reach_it(tied: bool, etcd_server: Any, shm_root: Path, job: str,
                                                   tmp_path: Path) -> None:
    from transformers import AutoProcessor

    from tandem.checkpoint_engine.service.publisher import Publisher

    lm = tiny_model.save_model(tmp_path / "lm", seed=4, tied=tied)
    vlm = build.build_llava(lm, tmp_path / "llava", seed=0)
    model = redrawn(vlm, tmp_path / "llava-v1")
    processor = AutoProcessor.from_pretrained(vlm)
    rng = random.Random(3)
    pics = [shapes.render(rng) for _ in range(3)]
    texts = [processor.apply_chat_template(warmup.messages(p.question), add_generation_prompt=True) for p in pics]
    expected, expanded = [], []
    for text, pic in zip(texts, pics, strict=True):
        inputs = processor(images=[pic.image], text=text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        expanded.append(inputs["input_ids"][0].tolist())
        expected.append(out[0, inputs["input_ids"].shape[1]:].tolist())

    reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    pub_reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    pub = Publisher(shm_root, job, pub_reg, keep=2)
    engine = RolloutEngine(EngineConfig(shm_root=shm_root, job=job, max_model_len=256), registry=reg)
    try:
        engine.start(str(vlm), dummy=True)
        # as the trainer publishes: a tied model's head is its embedding, not sent (the loader ties it again)
        version = pub.publish(None, ((k, v.contiguous()) for k, v in model.state_dict().items()
                                     if not (tied and k == "lm_head.weight"))).version
        assert any(k.startswith("model.vision_tower.embeddings.") for k in model.state_dict())  # transformers' names
        assert engine.update(None).version == version
        tok = processor.tokenizer
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        wire = decode_images([[encode_image(p.image)] for p in pics])
        got = engine.generate(ids, GREEDY, images=wire)
        assert [c[0].token_ids for c in got] == expected
        assert [c[0].prompt_token_ids for c in got] == expanded
        image_id = tok.convert_tokens_to_ids(build.IMAGE_TOKEN)
        assert all(c[0].prompt_token_ids.count(image_id) == build.IMAGE_TOKENS for c in got)
        other = shapes.render(random.Random(99)).image
        sampled = SamplingOptions(temperature=1.0, max_tokens=4, seed=1)
        a = engine.generate([ids[0]], sampled, images=[[pics[0].image]])[0][0]
        b = engine.generate([ids[0]], sampled.model_copy(update={"max_tokens": 4}), images=[[other]])[0][0]
        assert a.logprobs != b.logprobs or a.token_ids != b.token_ids
    finally:
        engine.terminate()
        pub.close()
        reg.close()
        pub_reg.close()


def test_adapter_versions_on_a_vlm_adapt_its_language_model(etcd_server: Any, shm_root: Path, job: str,
                                                           tmp_path: Path) -> None:
    """trainer.lora.sync adapter on a VLM: the trainer's adapters (lora.wrap inside the language model, as the hf
    engine wraps a VLM; saved under PEFT's names with its config, as export_adapters and adapter_config give them)
    are served by vLLM over the base it loaded, and its greedy completions of picture prompts and their log-probs
    equal transformers + PEFT on the same adapters; the adapters change what the base alone would give."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.sidecars.trainer.engines import lora
    from tandem.sidecars.trainer.engines.hf_engine import LANGUAGE_MODEL
    from tandem.spec.trainer import IMAGE_TOKEN_BIAS, Lora

    vlm = tiny_model.save_vlm(tmp_path)
    base = LlavaForConditionalGeneration.from_pretrained(vlm, dtype=torch.float32).eval()
    model = lora.wrap(LlavaForConditionalGeneration.from_pretrained(vlm, dtype=torch.float32),
                      Lora(rank=8, alpha=16), within=LANGUAGE_MODEL)
    state = tiny_model.random_adapters(model, seed=5)
    assert state and all(f".{LANGUAGE_MODEL}." in k for k in state), "adapters in the language model only"
    processor = AutoProcessor.from_pretrained(vlm)
    pics = [shapes.render(random.Random(s)) for s in (3, 4)]
    texts = [processor.apply_chat_template(warmup.messages(p.question), add_generation_prompt=True) for p in pics]
    reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    pub_reg = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    pub = Publisher(shm_root, job, pub_reg, keep=2)
    engine = RolloutEngine(EngineConfig(shm_root=shm_root, job=job, max_model_len=256, lora_rank=8), registry=reg)
    try:
        engine.start(str(vlm), dummy=True)  # with LoRA the base's own weights are loaded
        report = pub.publish(None, state.items(), adapter=lora.config_dict(model, vlm))
        assert engine.update(report.version).version == report.version and engine.lora is not None
        tok = processor.tokenizer
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        got = engine.generate(ids, GREEDY, images=[[p.image] for p in pics])
        image_id = tok.convert_tokens_to_ids(build.IMAGE_TOKEN)
        gap = moved = 0.0
        for text, pic, (c,) in zip(texts, pics, got, strict=True):
            inputs = processor(images=[pic.image], text=text, return_tensors="pt")
            full = torch.cat([inputs["input_ids"], torch.tensor([c.token_ids])], dim=1)
            start = inputs["input_ids"].shape[1]
            scored = []
            for m in (model, base):
                with torch.no_grad():
                    logits = m(input_ids=full, pixel_values=inputs["pixel_values"]).logits[0, start - 1:-1].float()
                logits[:, image_id] += IMAGE_TOKEN_BIAS  # as the rollout samples: the image token never
                scored.append(torch.log_softmax(logits, -1))
            peft, plain = scored
            assert peft.argmax(-1).tolist() == c.token_ids, "vLLM's greedy tokens are PEFT's"
            mine = peft.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
            gap = max(gap, float((mine - torch.tensor(c.logprobs)).abs().max()))
            moved = max(moved, float((plain.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1) - mine).abs()
                                     .max()))
        # the random adapters are large (x0.3, scale 2: they move log-probs by `moved`), and fp32 sums in another
        # order drift by up to ~2e-3 over six tokens; text adapters (test_adapter_versions) stay within 1e-3
        print(f"\nvLLM vs PEFT: largest log-prob gap {gap:.2e}; the adapters moved log-probs by up to {moved:.3f}")
        assert gap < 5e-3 and moved > 20 * gap, (gap, moved)
    finally:
        engine.terminate()
        pub.close()
        reg.close()
        pub_reg.close()
