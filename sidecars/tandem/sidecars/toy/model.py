"""The demo's tiny Qwen2 model (or a Gemma or Mixtral of the same size): config, random init, supervised warm-up,
greedy eval.

Role: gives the RL demo a model that already emits the answer format and is right some of the
time (a random model never is, so RL would see no reward signal), leaving room to improve.
Callers: `toy.build`, tests/toy.

The model: Qwen2, hidden 128, 2 layers, 4 heads with 2 KV heads (GQA), head dim 32, untied
embeddings, fp32, max 128 positions. The Mixtral (`family="mixtral"`, the toy mixture-of-experts of
routing replay) has the same attention and, in each layer, 4 experts of intermediate size 192 with
top-2 routing; its warm-up adds transformers' load-balancing loss (coefficient 0.02) so that every
expert gets tokens. Warm-up: plain torch on the HF model, AdamW with linear
decay, next-token loss on the completion tokens only (prompt masked), on freshly drawn problems.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tandem.sidecars.rewards.answer import answer_match
from tandem.sidecars.toy.task import make_problems, target_completion


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    tied: bool = False  # tie_word_embeddings: the output layer is the embedding (as in SmolLM2, Qwen2-0.5B)
    family: str = "qwen2"  # or gemma (tied always; a family only the hf trainer engine runs), or mixtral (MoE)
    num_experts: int = 4  # mixtral: experts per layer
    experts_per_token: int = 2  # mixtral: top-k routing
    expert_size: int = 192  # mixtral: each expert's intermediate size


def qwen2_config(tokenizer: Any, shape: ModelShape = ModelShape()) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=shape.tied, rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, use_sliding_window=False, dtype="float32",
    )


def gemma_config(tokenizer: Any, shape: ModelShape = ModelShape()) -> Any:
    """The same sizes as a Gemma: GeGLU MLP, embeddings scaled by sqrt(hidden), RMSNorm weights as 1 + w, tied."""
    from transformers import GemmaConfig

    return GemmaConfig(
        vocab_size=len(tokenizer), hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="float32",
    )


def mixtral_config(tokenizer: Any, shape: ModelShape = ModelShape()) -> Any:
    """The same attention as a Mixtral: GQA without biases, and a sparse MoE MLP (softmax over the top-k router
    logits, as megatron's router with pre-softmax off)."""
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=len(tokenizer), hidden_size=shape.hidden_size, intermediate_size=shape.expert_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings, tie_word_embeddings=shape.tied,
        rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu", num_local_experts=shape.num_experts,
        num_experts_per_tok=shape.experts_per_token, output_router_logits=True, router_aux_loss_coef=0.02,
        router_jitter_noise=0.0, sliding_window=None, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="float32",
    )


CONFIGS = {"qwen2": qwen2_config, "gemma": gemma_config, "mixtral": mixtral_config}


def random_model(tokenizer: Any, seed: int, shape: ModelShape = ModelShape()) -> Any:
    from transformers import AutoModelForCausalLM

    if shape.family not in CONFIGS:
        raise ValueError(f"toy family {shape.family!r} is not one of {sorted(CONFIGS)}")
    torch.manual_seed(seed)
    config = CONFIGS[shape.family](tokenizer, shape)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def _batch(tokenizer: Any, rows: Sequence[dict[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 on prompt and padding)."""
    seqs: list[list[int]] = []
    labels: list[list[int]] = []
    for r in rows:
        p = tokenizer(r["prompt"])["input_ids"]
        c = tokenizer(target_completion(r["answer"]), add_special_tokens=False)["input_ids"]
        c = [*c, tokenizer.eos_token_id]
        seqs.append([*p, *c])
        labels.append([-100] * len(p) + c)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.int64)
    lab = torch.full((len(seqs), width), -100, dtype=torch.int64)
    att = torch.zeros(len(seqs), width, dtype=torch.int64)
    for i, (s, lb) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(lb)] = torch.tensor(lb)
        att[i, :len(s)] = 1
    return ids, att, lab


@dataclass(frozen=True)
class WarmupReport:
    steps: int
    seconds: float
    final_loss: float


def warm_up(model: Any, tokenizer: Any, *, steps: int, seed: int, batch_size: int = 64, lr: float = 3e-3,
            max_operand: int = 20, callback: Callable[[int, float], bool] | None = None) -> WarmupReport:
    """Supervised fine-tuning on freshly drawn problems (seed+1000+step), completion tokens only.

    Learning rate: linear ramp over 20 steps, then constant. `callback(step, loss)` runs after each
    step and stops the warm-up by returning True (it must leave the model in train mode).
    """
    if steps <= 0:
        return WarmupReport(0, 0.0, float("nan"))
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    model.train()
    t0 = time.monotonic()
    loss_value = float("nan")
    done = 0
    for step in range(steps):
        rows = make_problems(seed + 1000 + step, batch_size, max_operand=max_operand)
        ids, att, lab = _batch(tokenizer, rows)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
        done = step + 1
        if callback is not None and callback(done, loss_value):
            break
    model.eval()
    return WarmupReport(done, time.monotonic() - t0, loss_value)


@torch.no_grad()  # type: ignore[untyped-decorator]
def generate(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 12,
             do_sample: bool = False, temperature: float = 1.0, batch_size: int = 128) -> list[str]:
    """Completions (special tokens removed) for `prompts`, greedy by default."""
    out: list[str] = []
    tokenizer.padding_side = "left"
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(list(prompts[i:i + batch_size]), return_tensors="pt", padding=True)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=do_sample,
                             temperature=temperature if do_sample else None, top_p=None, top_k=None,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        out.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    return out


def accuracy(model: Any, tokenizer: Any, rows: Sequence[dict[str, str]], **kwargs: Any) -> float:
    """Mean answerMatch reward of the model's completions on `rows` (greedy by default)."""
    completions = generate(model, tokenizer, [r["prompt"] for r in rows], **kwargs)
    scores = [answer_match(c, r["answer"]) for c, r in zip(completions, rows, strict=True)]
    return sum(scores) / max(len(scores), 1)
