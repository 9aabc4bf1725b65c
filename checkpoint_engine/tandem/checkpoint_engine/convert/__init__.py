"""Megatron <-> HuggingFace weight conversion: pure tensor functions, one mapping module per family.

Callers: the trainer's ``MegatronEngine`` (export after training, load at start) and the rollout
side of the checkpoint engine (``rollout_slice``). No megatron import happens here. Megatron names
are those of ``GPTModel.named_parameters()`` (no DDP/Float16 wrapper prefix) with *global* layer
and expert numbers and *full* (TP-merged, see :mod:`.tp`) tensors.

Adding a family = one module defining ``FAMILY`` (a :class:`~.dense.DenseDecoder` subclass) and
one entry in ``_FAMILIES`` below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import torch

from tandem.checkpoint_engine.convert import llama, mixtral, qwen2, qwen3
from tandem.checkpoint_engine.convert.dense import DenseDecoder
from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape
from tandem.checkpoint_engine.convert.tp import merge_tp, rollout_slice, split_tp

__all__ = [
    "ConversionError",
    "ModelShape",
    "family",
    "families",
    "to_hf",
    "from_hf",
    "hf_names",
    "merge_tp",
    "split_tp",
    "rollout_slice",
    "slice_for_rollout",
]

_FAMILIES: dict[str, DenseDecoder] = {m.FAMILY.name: m.FAMILY for m in (llama, qwen2, qwen3, mixtral)}


def families() -> list[str]:
    return sorted(_FAMILIES)


def family(shape: ModelShape) -> DenseDecoder:
    """The mapping for ``shape.family``, after checking the shape is one it covers."""
    mapping = _FAMILIES.get(shape.family)
    if mapping is None:
        raise ConversionError(f"no weight mapping for model_type {shape.family!r} (known: {families()})")
    mapping.check(shape)
    return mapping


def to_hf(
    shape: ModelShape, megatron_tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors from full Megatron tensors (tied output layer and vocab padding dropped)."""
    mapping = family(shape)
    for name, tensor in megatron_tensors:
        yield from mapping.to_hf(name, tensor, shape)


def from_hf(
    shape: ModelShape,
    hf_tensors: Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor],
    names: Iterable[str] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full Megatron tensors built from HF tensors; ``names`` (default: all) picks which.

    ``hf_tensors`` may be a mapping or a loader function, so that a caller reading safetensors
    lazily loads only the tensors it needs.
    """
    mapping = family(shape)
    get = hf_tensors if callable(hf_tensors) else hf_tensors.__getitem__
    for name in names if names is not None else mapping.megatron_names(shape):
        try:
            sources = [get(hf) for hf in mapping.hf_sources(name, shape)]
        except KeyError as exc:
            raise ConversionError(f"HF checkpoint lacks {exc} needed for {name}") from exc
        yield name, mapping.from_hf(name, sources, shape)


def hf_names(shape: ModelShape) -> list[str]:
    """Every HF tensor name the export of this model produces, in export order."""
    mapping = family(shape)
    names: list[str] = []
    for name in mapping.megatron_names(shape):
        for hf in (
            mapping.hf_sources(name, shape)
            if not name.endswith("output_layer.weight")
            else ["lm_head.weight"]
        ):
            if hf not in names:
                names.append(hf)
    return names


def slice_for_rollout(
    shape: ModelShape, hf_tensors: Iterable[tuple[str, torch.Tensor]], tp: int, rank: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each full HF tensor cut to the part vLLM rollout rank ``rank`` of ``tp`` holds."""
    mapping = family(shape)
    for name, tensor in hf_tensors:
        yield name, rollout_slice(mapping.rollout_split(name), name, tensor, shape, tp, rank)
