"""The hf engine's weights in and out by HF name: export (merged with LoRA), HF directories, loading, adapters.

Role: a mixin of `hf_engine.HFEngine` holding everything that reads or writes the FSDP2-sharded weights by
name: `export_hf` (whole tensors on rank 0, collective), `save_hf`, `load_hf_weights` (reference weights,
resume), and LoRA's adapter directory and training state. Every one of them first reshards the root module
(`_resharded`): FSDP2 leaves it unsharded after a forward without backward, and a weight written there
would be lost at the next reshard.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tandem.sidecars.trainer.engines import common
from tandem.sidecars.trainer.engines import lora as lora_weights
from tandem.sidecars.trainer.engines.common import EngineError, Parallelism


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (a view of its storage), any other tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (collective), any other tensor itself."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


class HFWeights:
    model: Any
    shape: Any  # hf_engine.HFShape
    par: Parallelism
    lora_scale: float | None
    model_dir: Path | None
    last_adapters: dict[str, torch.Tensor] | None
    last_export_seconds: float

    def _resharded(self) -> None:
        """The root module's weights back to their shards. FSDP2 leaves the root unsharded after a forward
        without backward (the embedding, final norm and head: its parameters are then plain tensors whose
        next forward reuses them); weights read or written by name must be the shards."""
        self.model.reshard()

    # ----- weights in and out -----
    def export_hf(self, target_tp: int = 1, target_rank: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's own HF state dict, whole, on rank 0 (every rank must exhaust the iterator: the
        gathers are collective); with LoRA, the base model's names with the adapters merged in. A tied output
        layer is left out, as `save_pretrained` leaves it out."""
        if target_tp != 1:
            raise EngineError("the hf trainer engine publishes whole tensors (rollout tensor parallelism slices "
                              "them on load)")
        start = time.perf_counter()
        self._resharded()
        state = self.model.state_dict()
        whole: Iterator[tuple[str, torch.Tensor]] = ((n, whole_tensor(t)) for n, t in state.items())  # collective
        if self.lora_scale is not None and self.is_export_rank:  # the others only join the gathers
            self.last_adapters = {}
            whole = lora_weights.merged(whole, self.lora_scale, self.last_adapters)
        for name, full in whole:
            if self.is_export_rank and not (self.shape.tie_embeddings and name == "lm_head.weight"):
                yield name, full.detach()
        self.last_export_seconds = time.perf_counter() - start

    def export_adapters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """LoRA: the adapters alone, whole, under the names PEFT saves them with, on the export rank (every
        rank must exhaust the iterator: the gathers are collective). An export of such a version writes its
        PEFT directory from the version itself (hf_export), so no copy is kept here."""
        if self.lora_scale is None:
            raise EngineError("adapter-only versions need trainer.lora")
        start = time.perf_counter()
        self._resharded()
        for name, tensor in self.model.state_dict().items():
            if not lora_weights.is_adapter(name):
                continue
            full = whole_tensor(tensor)  # collective
            if self.is_export_rank:
                yield lora_weights.saved_name(name), full.detach()
        self.last_export_seconds = time.perf_counter() - start

    def adapter_config(self) -> dict[str, Any]:
        """LoRA: the PEFT adapter config (adapter_config.json's content, the base model's path in it)."""
        return lora_weights.config_dict(self.model, self.model_dir)

    def save_hf(self, out_dir: str | Path, config_dir: str | Path) -> Path:
        """The weights as a HF directory (`interface.save_hf_dir`). Collective; the export rank writes."""
        from tandem.sidecars.trainer.engines.interface import save_hf_dir

        return save_hf_dir(self, out_dir, config_dir)

    def load_hf_weights(self, source: Path | Callable[[str], torch.Tensor], adapters: bool = False) -> int:
        """Copy HF weights (a directory's safetensors, or a name -> tensor loader) into this rank's shards;
        returns how many tensors were loaded. A name the source lacks is an EngineError naming it. With LoRA
        the weights become the base model's and the adapters start again from zero (B = 0): the model then
        computes exactly the loaded weights; with `adapters` the source also gives the adapters, under the
        names PEFT saves them with (an adapter-only version over the base model's weights)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        reader = common.SafetensorsDir(source) if isinstance(source, Path) else source
        self._resharded()
        loaded = 0
        with torch.no_grad():
            for peft_name, param in self.model.named_parameters():
                if lora_weights.is_adapter(peft_name) and not adapters:
                    if ".lora_B." in peft_name:
                        param.zero_()
                    continue
                if lora_weights.is_adapter(peft_name):
                    name = lora_weights.saved_name(peft_name)
                else:
                    name = lora_weights.hf_name(peft_name) if self.lora_scale is not None else peft_name
                try:
                    full = reader(name)
                except KeyError as exc:
                    raise EngineError(f"{name}: not in the weights loaded ({source})") from exc
                if tuple(full.shape) != tuple(param.shape):
                    raise EngineError(f"{name}: the weights give {tuple(full.shape)}, the model has "
                                      f"{tuple(param.shape)}")
                full = full.to(param.dtype)
                if isinstance(param, DTensor):
                    full = distribute_tensor(full.to(param.device_mesh.device_type), param.device_mesh,
                                             param.placements, src_data_rank=None)
                param.copy_(full)
                loaded += 1
        return loaded

    def load_adapter_version(self, tensors: Callable[[str], torch.Tensor]) -> int:
        """An adapter-only version (`export_adapters`'s names) over the base model's own weights, from the
        model directory: the model then computes exactly what the rollouts served. Collective."""
        if self.model_dir is None or self.lora_scale is None:
            raise EngineError("an adapter-only version loads only into a LoRA engine built from a model directory")
        base = common.SafetensorsDir(self.model_dir)

        def reader(name: str) -> torch.Tensor:
            return tensors(name) if lora_weights.is_adapter(name) else base(name)

        return self.load_hf_weights(reader, adapters=True)

    def write_adapter(self, out_dir: str | Path) -> Path | None:
        """LoRA, on the export rank: the adapters of the last `export_hf` as a PEFT adapter directory; None
        without LoRA or before an export. Not collective."""
        if self.lora_scale is None or not self.last_adapters:
            return None
        return lora_weights.write_adapter_dir(Path(out_dir), self.last_adapters, self.model, self.model_dir)

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        """LoRA: this rank's shards of the adapters (copies), for the training state; None without LoRA."""
        if self.lora_scale is None:
            return None
        return {n: t.detach().clone() for n, t in self.named_parameters() if lora_weights.is_adapter(n)}

    def restore_adapters(self, state: dict[str, torch.Tensor]) -> None:
        """Undo a merged version's load: the base model's own weights again, and the adapters of `state`
        (`adapter_state` of the run that published it), so training continues exactly where it stopped."""
        if self.model_dir is None or self.lora_scale is None:
            raise EngineError("adapters can be restored only on a LoRA engine built from a model directory")
        self.load_hf_weights(self.model_dir)
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)

    @property
    def is_export_rank(self) -> bool:
        return self.par.dp_rank == 0

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's shards (views of the parameters' storage), HF names."""
        self._resharded()
        for name, param in self.model.named_parameters():
            yield name, local_shard(param)
