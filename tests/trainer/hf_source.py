"""A tiny HF model directory with a tokenizer and a chat template, and its weights laid out as a published
version with the checkpoint engine's own writer: the sources the HF-export tests start from.

Callers: tests/trainer/test_hf_export.py, tests/cli/test_export.py. No downloads: the model comes from
tiny_models.make_tiny_hf_model, the tokenizer from tests/rollout_engine/tiny_model.build_tokenizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
import tiny_model  # noqa: E402
from tiny_models import make_tiny_hf_model  # noqa: E402

from tandem.checkpoint_engine.versions import (
    version_writer,  # noqa: E402
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MESSAGES = [{"role": "system", "content": "alpha beta"}, {"role": "user", "content": "gamma 12 delta"}]


def make_source(directory: Path, tied: bool, seed: int = 0, **shape: int) -> Path:
    """config.json + model.safetensors (qwen2, vocab of the tokenizer), tokenizer files with a chat
    template (transformers writes chat_template.jinja), and a generation_config.json of its own; `shape`
    goes to make_tiny_hf_model (hidden, heads, ...)."""
    from transformers import AutoTokenizer

    out = make_tiny_hf_model(directory, family="qwen2", vocab=tiny_model.VOCAB, tie=tied, seed=seed, **shape)
    tiny_model.build_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    gen = json.loads((out / "generation_config.json").read_text())
    gen.update(do_sample=True, temperature=0.7, top_p=0.9)
    (out / "generation_config.json").write_text(json.dumps(gen))
    return out


def hf_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """The model's tensors as saved (a tied model's file has no lm_head.weight)."""
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def publish(root: Path, model_dir: Path, version: int, with_tied_head: bool = False,
            shard_bytes: int = 96 * 1024) -> Path:
    """Lay the model out as version `version` of job "job" under `root` (several shards); a tied model's
    `lm_head.weight` is left out as the trainer's export does, unless `with_tied_head`."""
    state = hf_state(model_dir)
    if with_tied_head:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return version_writer.write_version(root, "job", version, sorted(state.items()), shard_bytes=shard_bytes).path


def logits(model_dir: Path, dtype: torch.dtype | str = torch.float32) -> torch.Tensor:
    """Logits of the chat-templated MESSAGES under the model and tokenizer in `model_dir` (dtype "auto":
    config.json's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    with torch.no_grad():
        return model(input_ids=ids["input_ids"]).logits
