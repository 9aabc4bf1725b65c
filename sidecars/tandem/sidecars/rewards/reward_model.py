"""Reward-model scorer: a HuggingFace sequence-classification directory scoring (prompt, completion).

Role: the `model` reward (spec `Reward.path`). Callers: `rewards.combine.RewardSet`, on the thread
that runs the model-based inference work (it shares the accelerator with the reference model).

Text: the tokenizer's chat template (user = prompt, assistant = completion) when it has one,
else `prompt + completion`; truncated on the left to `max_length` tokens so the completion's end
is kept. Score: the logit when the head has one label, else the probability of the last label
("positive"). Batched with padding; padding side follows the tokenizer, and the model finds the
last real token through `config.pad_token_id` (set from the tokenizer when missing).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


class RewardModelError(RuntimeError):
    """The reward-model directory cannot be loaded as a sequence classifier."""


class RewardModelScorer:
    def __init__(self, path: str | Path, *, device: str = "cpu", batch_size: int = 16,
                 max_length: int = 1024, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(str(path))
            self.model: Any = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=dtype)
        except (OSError, ValueError) as e:
            raise RewardModelError(f"reward model {path}: {e}") from e
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.tokenizer.truncation_side = "left"
        self.model.to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length

    def text(self, prompt: str, completion: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False))
        return prompt + completion

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """One float per (prompt, completion), in order."""
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in length")
        with torch.no_grad():
            return self._score([self.text(p, c) for p, c in zip(prompts, completions, strict=True)])

    def _score(self, texts: list[str]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length)
            logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits.float()
            if logits.shape[-1] == 1:
                out.extend(logits[:, 0].tolist())
            else:
                out.extend(torch.softmax(logits, dim=-1)[:, -1].tolist())
        return out

    def release(self) -> None:
        """Drop the weights (the VRAM phase that frees the accelerator between iterations)."""
        self.model.to("cpu")
        del self.model
