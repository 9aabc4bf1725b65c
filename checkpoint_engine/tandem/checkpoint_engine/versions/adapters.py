"""Adapter-only versions: LoRA adapters published, checked, served and exported without the base weights.

Role: with `trainer.lora.sync: adapter` a version holds only the adapters (A and B of each adapted linear
layer, a few MB) under the names PEFT saves them with (`base_model.model.<module>.lora_A.weight`), and its
index carries the PEFT adapter config (`VersionIndex.adapter`: r, lora_alpha, target_modules, ...). The
base weights are the job's model directory, which the rollout engine loads at start and the trainer keeps
frozen. Here:
- `expected` derives the names, shapes and dtype a version may hold from the base model's parameters
  (`rollout_engine.expected_parameters`) and the config, for `layout.validate` before vLLM sees anything;
- `write_peft_dir` turns a version into a PEFT adapter directory (atomically), which vLLM loads as a LoRA
  adapter (`RolloutEngine`) and PEFT loads onto the base model (`tandem export`, spec.export);
- `merged` yields the base model's weights with each adapter merged in (W + alpha / r * B A), for the
  merged model an export writes beside the adapter.
Callers: the rollout engine (tandem.sidecars.rollout_engine.engine: validate, serve), hf_export.py (export).
Imports nothing from the sidecars.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import layout

PREFIX = "base_model.model."
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig.max_lora_rank choices


def vllm_max_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of rank `rank`."""
    for r in VLLM_MAX_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({VLLM_MAX_RANKS[-1]})")


def module_of(name: str) -> tuple[str, str]:
    """(module, "A" | "B") of an adapter tensor's saved name; ValueError for any other name."""
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if name.startswith(PREFIX) and name.endswith(suffix):
            return name[len(PREFIX):-len(suffix)], part
    raise ValueError(f"{name!r} is not an adapter weight ({PREFIX}<module>.lora_A/B.weight)")


def expected(index: layout.VersionIndex, base: Mapping[str, layout.Expected],
             dtype: str) -> dict[str, layout.Expected]:
    """What the adapter version `index` may hold on the base model whose parameters are `base`: for every
    module its tensors name, A (r x in) and B (out x r) of that module's 2-D weight, in `dtype`. A module the
    base lacks, a rank other than the config's r, or half a pair is an InvalidVersion naming it."""
    config = index.adapter or {}
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise errors.InvalidVersion(f"version {index.version}: adapter config without a rank r ({config!r})")
    want: dict[str, layout.Expected] = {}
    modules: dict[str, set[str]] = {}
    for rec in index.tensors:
        try:
            module, part = module_of(rec.name)
        except ValueError as e:
            raise errors.InvalidVersion(f"version {index.version}: {e}") from e
        weight = base.get(f"{module}.weight")
        if weight is None or len(weight.shape) != 2:
            raise errors.InvalidVersion(f"version {index.version}: {rec.name} adapts {module}, which is no linear "
                                        "layer of the base model")
        out, inp = weight.shape
        shape = (rank, inp) if part == "A" else (out, rank)
        want[rec.name] = layout.Expected(shape, dtype)
        modules.setdefault(module, set()).add(part)
    half = sorted(m for m, parts in modules.items() if parts != {"A", "B"})
    if half:
        raise errors.InvalidVersion(f"version {index.version}: adapters without their A/B pair: {half[:8]}")
    if not want:
        raise errors.InvalidVersion(f"version {index.version} is an adapter version without adapters")
    return want


def config_json(config: Mapping[str, Any], base_dir: str | Path | None) -> str:
    """adapter_config.json's text: the version's config, its base model path set to `base_dir`."""
    data = dict(config)
    if base_dir is not None:
        data["base_model_name_or_path"] = str(base_dir)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_peft_dir(tensors: Iterable[tuple[str, torch.Tensor]], config: Mapping[str, Any], out: Path,
                   base_dir: str | Path | None = None) -> Path:
    """A PEFT adapter directory (adapter_model.safetensors, adapter_config.json) at `out`, written under a
    temporary name and renamed into place, so a reader finds it whole or not at all. Returns `out`."""
    from safetensors.torch import save_file

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        save_file({n: t.contiguous().clone() for n, t in tensors}, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(config_json(config, base_dir))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def scale(config: Mapping[str, Any]) -> float:
    """The factor of B A in the update: lora_alpha / r (PEFT's default scaling; rsLoRA: / sqrt(r))."""
    rank = float(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    return alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank


def merge_weight(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, factor: float) -> torch.Tensor:
    """W + factor x B A, computed in fp32 and cast back to W's dtype (the trainer's merged versions too)."""
    return (weight.float() + (b.float() @ a.float()) * factor).to(weight.dtype)


def merged(base: Iterable[tuple[str, torch.Tensor]], adapters: Mapping[str, torch.Tensor],
           config: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights with every adapter merged in: W + scale * B A (in fp32, cast back to W's
    dtype), as PEFT's merge_and_unload computes it. An adapter whose module the base lacks is an error."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapters.items():
        module, part = module_of(name)
        pairs.setdefault(module, {})[part] = tensor
    factor, used = scale(config), set()
    for name, weight in base:
        module = name.removesuffix(".weight")
        pair = pairs.get(module) if name.endswith(".weight") else None
        if pair is None:
            yield name, weight
            continue
        used.add(module)
        yield name, merge_weight(weight, pair["A"], pair["B"], factor)
    if set(pairs) - used:
        raise errors.InvalidVersion(f"adapters of modules the base model lacks: {sorted(set(pairs) - used)[:8]}")


def base_weights(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's tensors from its safetensors files (HF names), one file open at a time."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise errors.InvalidVersion(f"{model_dir}: no *.safetensors to merge the adapters into")
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is no mapping
                yield name, handle.get_tensor(name)
