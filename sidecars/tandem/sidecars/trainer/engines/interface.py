"""The trainer-engine interface.

Role: the loop's phases (`trainer.loop`) train through one interface, drawn from what they call:
load (`from_hf`), log-probs (policy, reference, values), a train step, offload and onload around the
rollout, export of HF-named weights (publish, durable copies, export dirs) and loading them back
(reference weights, resume). Two implementations: `megatron_engine.MegatronEngine` (tensor, pipeline,
expert and data parallel; the families of `checkpoint_engine.convert`) and `hf_engine.HFEngine`
(transformers + FSDP2, data parallel; any causal LM transformers loads); `engine_choice.build_engine` picks one by
`trainer.engine`. `save_hf_dir` writes either engine's weights as a HF directory.
Callers: the loop (`loop.start`, `loop.inference`, `loop.train`, `loop.publish`, `loop.reference`, `loop.resume`,
`loop.train_state`) and both engines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from tandem.sidecars.trainer.engines.common import Parallelism

LossFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Mapping[str, Any]]]


class Shape(Protocol):
    """What the loop reads of the model's architecture."""

    @property
    def family(self) -> str: ...
    @property
    def hidden(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def tie_embeddings(self) -> bool: ...


class TrainerEngine(Protocol):
    """One trainer engine. Every method that touches the model is collective over the job's ranks."""

    shape: Any  # a `Shape`
    par: Parallelism
    model: Any  # the wrapped model (Megatron's DDP module, or the FSDP2-sharded transformers model)
    optimizer: Any
    last_step_rows: int
    last_export_seconds: float
    temperature: float  # log-probs are of the logits divided by it: rollout.temperature, the policy that sampled

    def token_logprobs(self, batch: Any, micro_batch_size: int | None = None,
                       scored_only: bool = False) -> torch.Tensor: ...
    def logits(self, batch: Any) -> torch.Tensor: ...
    def train_step(self, batch: Any, loss_fn: LossFn, micro_batch_size: int | None = None,
                   reduction: Literal["mean", "sum"] = "mean") -> dict[str, float]: ...
    def set_lr(self, lr: float) -> None: ...
    def offload(self) -> dict[str, float]: ...
    def onload(self) -> dict[str, float]: ...
    def export_hf(self, target_tp: int = 1, target_rank: int = 0) -> Iterator[tuple[str, torch.Tensor]]: ...
    def save_hf(self, out_dir: str | Path, config_dir: str | Path) -> Path: ...
    def load_hf_weights(self, source: Path | Callable[[str], torch.Tensor]) -> int: ...
    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]: ...
    @property
    def is_export_rank(self) -> bool: ...

    # LoRA (trainer.lora, the hf engine; an engine without adapters raises EngineError)
    def export_adapters(self) -> Iterator[tuple[str, torch.Tensor]]: ...
    def adapter_config(self) -> dict[str, Any]: ...
    def load_adapter_version(self, tensors: Callable[[str], torch.Tensor]) -> int: ...


class Exporter(Protocol):
    """What writing a HF directory needs of an engine."""

    def export_hf(self, target_tp: int = 1, target_rank: int = 0) -> Iterator[tuple[str, torch.Tensor]]: ...
    @property
    def is_export_rank(self) -> bool: ...


def save_hf_dir(engine: Exporter, out_dir: str | Path, config_dir: str | Path) -> Path:
    """`engine`'s weights as a HF directory: `model.safetensors` plus the non-weight files of `config_dir`
    (config, tokenizer, generation config). Collective (the export is); the export rank writes."""
    import shutil

    import torch.distributed as dist
    from safetensors.torch import save_file

    out = Path(out_dir)
    tensors = {name: tensor.contiguous().clone() for name, tensor in engine.export_hf()}
    if engine.is_export_rank:
        out.mkdir(parents=True, exist_ok=True)
        for item in Path(config_dir).iterdir():
            if item.is_file() and item.suffix != ".safetensors" and not item.name.endswith(".index.json"):
                shutil.copy2(item, out / item.name)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if dist.is_initialized():
        dist.barrier()
    return out
