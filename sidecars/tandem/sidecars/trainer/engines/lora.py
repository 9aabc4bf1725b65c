"""LoRA on the hf engine: the PEFT wrap, the adapters' names and config, and the merged HF-named weights.

Role: `trainer.lora` trains low-rank adapters (PEFT's `LoraConfig`: rank, alpha, target modules, dropout) on
a frozen base model; Adam's state exists for the adapters only. A published version carries the adapters
alone under the names PEFT saves them with (`lora.sync: adapter`, served by vLLM as a LoRA adapter), or the
merged weights, W + (alpha / rank) B A under the base model's own HF names (`merged`), which the rollouts
load like any version. On a vision-language model the adapters sit in its language model only (`targets`).
Names: PEFT's `base_model.model.<hf>` with each adapted linear's weight under `<module>.base_layer.weight` and
its adapter under `<module>.lora_A/B.default`.
The adapters alone are also kept from each export, for a PEFT adapter directory beside each exported model.
Caller: `hf_engine.HFEngine` (from_hf, export_hf, load_hf_weights, write_adapter).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint_engine.versions.adapters import merge_weight

PREFIX = "base_model.model."
ADAPTER = "default"


def wrap(model: Any, settings: Any, within: str | None = None) -> Any:
    """`model` as a PeftModel with `settings` (`spec.models.Lora`): only the adapters train. `within` (a module
    path: a vision-language model's language model) keeps the adapters inside that module (`targets`)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout, bias="none",
                        target_modules=targets(model, list(settings.target_modules), within))
    return get_peft_model(model, config)


def targets(model: Any, names: list[str], within: str | None) -> str | list[str]:
    """PEFT's target_modules for `names` (trainer.lora.targetModules). Inside `within`: a pattern PEFT matches
    against whole module names, so a vision tower's q_proj or fc1 is never adapted (vLLM serves LoRA on a VLM's
    language model only); [all-linear] there is every linear layer of that module (the output layer is outside
    it). A name no module of `within` has is refused naming it."""
    if within is None:
        return "all-linear" if names == ["all-linear"] else names
    found = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
             if n.startswith(within + ".") and isinstance(m, torch.nn.Linear)}
    wanted = sorted(found) if names == ["all-linear"] else names
    missing = sorted(set(wanted) - found)
    if missing or not wanted:
        raise ValueError(f"trainer.lora.targetModules: {missing or names} name no linear layer of {within} "
                         f"(it has {', '.join(sorted(found)) or 'none'})")
    return rf"{re.escape(within)}\..*\.({'|'.join(re.escape(n) for n in wanted)})"


def scale(model: Any) -> float:
    config = model.peft_config[ADAPTER]
    return float(config.lora_alpha) / float(config.r)


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def hf_name(name: str) -> str:
    """The base model's HF name of a PEFT parameter that is not an adapter."""
    name = name.removeprefix(PREFIX)
    return name.replace(".base_layer.", ".")


def saved_name(name: str) -> str:
    """The name PEFT saves an adapter parameter under (its adapter's name dropped)."""
    return name.replace(f".{ADAPTER}.", ".")


def param_name(saved: str) -> str:
    """The adapter parameter a saved name (`saved_name`) belongs to."""
    return saved.replace(".lora_A.", f".lora_A.{ADAPTER}.").replace(".lora_B.", f".lora_B.{ADAPTER}.")


def config_dict(model: Any, base_dir: Path | None) -> dict[str, Any]:
    """The adapter's PEFT config as adapter_config.json holds it (sets as sorted lists, enums as text)."""
    import json

    data = model.peft_config[ADAPTER].to_dict()
    data["base_model_name_or_path"] = str(base_dir) if base_dir is not None else None
    return dict(json.loads(json.dumps(data, default=lambda v: sorted(v) if isinstance(v, set) else str(v))))


def merged(items: Iterable[tuple[str, torch.Tensor]], factor: float,
           adapters: dict[str, torch.Tensor] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """PEFT state-dict entries (whole tensors, in the model's order) -> HF-named weights with each adapter
    merged into its base weight. Holds at most one module's base and adapter at a time (PEFT lists an
    adapted linear's base weight, then its A, then its B). `adapters`, when given, receives the adapter
    tensors under the names PEFT saves them with (`write_adapter_dir`)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        if adapters is not None and is_adapter(name):
            adapters[saved_name(name)] = tensor.detach().clone()
        if is_adapter(name) or name.endswith(".base_layer.weight"):
            module = name.split(".lora_")[0] if is_adapter(name) else name.removesuffix(".base_layer.weight")
            part = "A" if ".lora_A." in name else "B" if ".lora_B." in name else "W"
            slot = pending.setdefault(module, {})
            slot[part] = tensor
            if len(slot) == 3:
                del pending[module]
                yield hf_name(module) + ".weight", merge_weight(slot["W"], slot["A"], slot["B"], factor)
            continue
        yield hf_name(name), tensor
    if pending:
        raise ValueError(f"adapters without their base weight or A/B pair: {sorted(pending)}")


def write_adapter_dir(out: Path, adapters: dict[str, torch.Tensor], model: Any, base_dir: Path | None) -> Path:
    """A PEFT adapter directory (`adapter_model.safetensors`, `adapter_config.json`) that `PeftModel.
    from_pretrained(base, out)` loads onto the base model at `base_dir`: the checkpoint engine's writer
    (`adapters.write_peft_dir`, atomic), which also writes adapter versions' exports."""
    from tandem.checkpoint_engine.versions.adapters import write_peft_dir

    return write_peft_dir(adapters.items(), config_dict(model, base_dir), out, base_dir=base_dir)
