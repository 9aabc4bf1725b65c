"""LoRA on the hf engine: the PEFT wrap, and the merged HF-named weights a version carries.

Role: `trainer.lora` trains low-rank adapters (PEFT's `LoraConfig`: rank, alpha, target modules, dropout) on
a frozen base model; Adam's state exists for the adapters only. A published version carries the merged
weights, W + (alpha / rank) B A under the base model's own HF names, so the rollouts load it like any
version and the conversion layer stays the identity. Names: PEFT's `base_model.model.<hf>` with each
adapted linear's weight under `<module>.base_layer.weight` and its adapter under `<module>.lora_A/B.default`.
Caller: `hf_engine.HFEngine` (from_hf, export_hf, load_hf_weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

PREFIX = "base_model.model."
ADAPTER = "default"


def wrap(model: Any, settings: Any) -> Any:
    """`model` as a PeftModel with `settings` (`spec.models.Lora`): only the adapters train."""
    from peft import LoraConfig, get_peft_model

    targets = settings.target_modules
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                        target_modules="all-linear" if targets == ["all-linear"] else list(targets))
    return get_peft_model(model, config)


def scale(model: Any) -> float:
    config = model.peft_config[ADAPTER]
    return float(config.lora_alpha) / float(config.r)


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def hf_name(name: str) -> str:
    """The base model's HF name of a PEFT parameter that is not an adapter."""
    name = name.removeprefix(PREFIX)
    return name.replace(".base_layer.", ".")


def merged(items: Iterable[tuple[str, torch.Tensor]], factor: float) -> Iterator[tuple[str, torch.Tensor]]:
    """PEFT state-dict entries (whole tensors, in the model's order) -> HF-named weights with each adapter
    merged into its base weight. Holds at most one module's base and adapter at a time (PEFT lists an
    adapted linear's base weight, then its A, then its B)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        if is_adapter(name) or name.endswith(".base_layer.weight"):
            module = name.split(".lora_")[0] if is_adapter(name) else name.removesuffix(".base_layer.weight")
            part = "A" if ".lora_A." in name else "B" if ".lora_B." in name else "W"
            slot = pending.setdefault(module, {})
            slot[part] = tensor
            if len(slot) == 3:
                del pending[module]
                delta = (slot["B"].float() @ slot["A"].float()) * factor
                yield hf_name(module) + ".weight", (slot["W"].float() + delta).to(slot["W"].dtype)
            continue
        yield hf_name(name), tensor
    if pending:
        raise ValueError(f"adapters without their base weight or A/B pair: {sorted(pending)}")
