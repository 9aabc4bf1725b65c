"""The trainer's view of Megatron: load a HF model, log-probs, train steps, offload, export.

Used by the trainer sidecar's RL driver (built by `engine_choice.build_engine`) and by tests.
Every method that touches the model is collective: all ranks of the job call it with the same
arguments (the batch may differ across data-parallel ranks). Runs on GPUs (NCCL) or, with
:mod:`.cpu_compat`, on CPUs (gloo). Pipeline stages are driven by Megatron's own schedules, so
gradient accumulation over micro-batches and pipeline parallelism share one path.

Here: construction (`from_hf`: the model built from a HF directory, wrapped for training or frozen), the train
step, the learning rate, offload and onload, and export (HF names for the rollouts, a HF directory). The
forward passes, the packed-batch layout and the log-prob alignment are `megatron_forward.MegatronForward`'s,
which this engine extends.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from tandem.checkpoint_engine.convert import ModelShape
from tandem.sidecars.trainer.engines import common, megatron_build, megatron_export, micro_batches
from tandem.sidecars.trainer.engines.common import EngineError
from tandem.sidecars.trainer.engines.megatron_forward import MegatronForward
from tandem.sidecars.trainer.engines.offload import optimizer_tensors

VALUE_HEAD = "output_layer.weight"  # a critic's untied output layer; its column 0 is the value head

LossFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Mapping[str, Any]]]
"""``loss_fn(logprobs, micro_batch) -> (scalar loss, metrics)``; ``Algorithm.loss`` fits."""

__all__ = ["MegatronEngine", "EngineError", "LossFn"]
NO_LORA = "the megatron engine trains no LoRA adapters (trainer.lora runs on trainer.engine hf)"


class MegatronEngine(MegatronForward):
    """A Megatron GPTModel with its DDP wrapper and optimizer, built from a HF directory."""

    # ----- construction -----
    @classmethod
    def from_hf(
        cls,
        model_dir: str | Path,
        *,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        expert_parallel: int = 1,
        lr: float = 1e-6,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        weight_decay: float = 0.0,
        clip_grad: float = 1.0,
        micro_batch_size: int = 1,
        micro_batch_tokens: int | None = None,
        distributed_optimizer: bool = False,
        trainable: bool = True,
        value_head: bool = False,
        recompute: bool = False,
        routing_replay: bool = False,
    ) -> MegatronEngine:
        """Start process groups, build the model matching ``model_dir`` and load its weights.

        ``trainable=False`` builds a forward-only engine (no DDP wrapper, no optimizer), e.g. for
        the reference model: ``token_logprobs``, ``logits``, ``offload``/``onload`` and
        ``export_hf`` work, ``train_step`` raises. Several engines may live in one process when
        they share the parallel sizes. ``value_head=True`` builds a critic: the same transformer
        with an untied output layer set to zero, whose first column is the value head; its
        ``token_logprobs`` and train-step inputs are then values (``heads.values``). ``recompute``
        recomputes each layer's activations in the backward (``megatron_build.transformer_config``).
        ``routing_replay`` (a MoE model; algorithm.routingReplay): a batch's ``routed_experts`` are replayed
        in every MoE layer of every forward that takes the batch (:mod:`.routing_replay`).
        """
        model_dir = Path(model_dir)
        shape = ModelShape.from_hf_dir(model_dir).with_padded_vocab(tensor_parallel)
        megatron_build.check_experts(shape, expert_parallel)
        if routing_replay and not shape.num_experts:
            raise EngineError("algorithm.routingReplay needs a mixture-of-experts model; this one has no experts")
        if routing_replay and recompute and pipeline_parallel > 1:
            raise EngineError("algorithm.routingReplay with trainer.activationCheckpointing and pipeline parallelism "
                              "is not supported (a recomputed forward would replay another micro-batch's routing)")
        par = megatron_build.init_distributed(tensor_parallel, pipeline_parallel, expert_parallel)
        if value_head:
            shape = dataclasses.replace(shape, tie_embeddings=False)
        from megatron.core import tensor_parallel as mtp
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module

        torch.manual_seed(seed)
        mtp.model_parallel_cuda_manual_seed(seed)
        config = megatron_build.transformer_config(shape, par, dtype, recompute=recompute,
                                                   routing_replay=routing_replay)
        gpt = megatron_build.build_gpt(shape, config)
        megatron_build.load_hf_weights(gpt, model_dir, shape, par, skip=(VALUE_HEAD,) if value_head else ())
        if value_head:
            with torch.no_grad():
                for name, param in gpt.named_parameters():
                    if name == VALUE_HEAD:
                        param.zero_()  # values start at 0, as a fresh value head should
        if torch.cuda.is_available():
            gpt.cuda()
        module: Any = Float16Module(config, gpt) if dtype in (torch.bfloat16, torch.float16) else gpt
        if not trainable:
            module.eval()
            for param in module.parameters():
                param.requires_grad_(False)
            return cls(module, gpt, None, shape, par, config, micro_batch_size, value_head, micro_batch_tokens)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=distributed_optimizer,
        )
        model = DistributedDataParallel(config, ddp_config, module)
        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=lr,
                min_lr=lr,
                weight_decay=weight_decay,
                clip_grad=clip_grad,
                bf16=dtype == torch.bfloat16,
                fp16=dtype == torch.float16,
                params_dtype=dtype,
                use_distributed_optimizer=distributed_optimizer,
                adam_beta1=0.9,
                adam_beta2=0.999,
                adam_eps=1e-8,
            ),
            [model],
        )
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = model.no_sync
        return cls(model, gpt, optimizer, shape, par, config, micro_batch_size, value_head, micro_batch_tokens)

    # ----- training -----
    def train_step(
        self,
        batch: Any,
        loss_fn: LossFn,
        micro_batch_size: int | None = None,
        reduction: Literal["mean", "sum"] = "mean",
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` with gradient accumulation over micro-batches.

        ``batch`` is the global batch: with data parallelism each dp rank trains on its own
        contiguous share of the rows (``micro_batches.dp_share``; gradients meet in DDP's
        all-reduce), split into micro-batches of ``micro_batch_size`` rows (default: the engine's),
        each in the batch's own type (``PackedBatch.rows``); the loss of each is ``loss_fn(logprobs,
        micro_batch)`` with ``logprobs`` as :meth:`token_logprobs` but with gradient; when the batch
        has a ``loss_mask`` (labels layout), only the tokens it scores get log-probs (0 elsewhere)
        and the output layer runs on those positions only. The optimised loss is the ``reduction``
        of the micro-batch losses: ``"mean"`` (Megatron's own), or ``"sum"`` for losses already
        weighted for the whole batch (the algorithms' ``PackedBatch.weights``), over every
        micro-batch of every dp rank. Returns (same on every rank) ``loss`` (that reduction), the
        mean of each metric over micro-batches, ``grad_norm``, ``update_ok`` (0 when the step was
        skipped, e.g. a non-finite gradient) and ``step_seconds``.
        """
        if self.optimizer is None:
            raise EngineError("this engine was built with trainable=False")
        start = time.perf_counter()
        self.model.train()
        mbs, counted, self.last_step_rows = micro_batches.train_share(
            batch, self.par.dp, self.par.dp_rank, lambda part: self._micro_batches(part, micro_batch_size))
        total = int(common.dp_sum(self.par, [float(counted)])[0])
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        # Megatron divides each rank's loss by its micro-batch count and DDP averages gradients over
        # the dp ranks; this scale turns that into the sum (or the mean) over every micro-batch.
        scale = counted * self.par.dp * (1.0 if reduction == "sum" else 1.0 / max(total, 1))

        def micro_loss(mb: Any, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            loss, metrics = loss_fn(self._outputs(logits, mb), mb)
            values = {k: float(v) for k, v in metrics.items()}
            values["loss"] = float(loss.detach())
            return loss * scale, values

        # a batch with a loss_mask (the algorithms' PackedBatch): logits of the scored tokens only
        self._scoring = self.score_only_loss_positions and not self.value_head and bool(self.gpt.post_process)
        try:
            outs = self._run(mbs, micro_loss, False)
        finally:
            self._scoring = False
        update_ok, grad_norm, _ = self.optimizer.step()
        metrics: dict[str, float] = {}
        if outs:  # the last pipeline stage: means over every micro-batch of every dp rank
            sums: dict[str, float] = {}
            for o in outs:
                common.accumulate(sums, o, 1.0 if counted else 0.0)
            metrics = common.step_metrics(self.par, sums, total, reduction)
        metrics = self._metrics_from_last_stage(metrics)
        metrics.update(
            grad_norm=float(grad_norm or 0.0),
            update_ok=float(bool(update_ok)),
            step_seconds=time.perf_counter() - start,
        )
        return metrics

    def _metrics_from_last_stage(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.par.pp == 1:
            return metrics
        from megatron.core import parallel_state as ps

        box: list[Any] = [metrics]
        dist.broadcast_object_list(
            box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        return dict(box[0])

    def set_lr(self, lr: float) -> None:
        if self.optimizer is None:
            raise EngineError("this engine was built with trainable=False")
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ----- memory phases -----
    def _state_tensors(self) -> list[torch.Tensor]:
        tensors: list[torch.Tensor] = []
        for param in self.model.parameters():
            tensors.append(param)
            grad = getattr(param, "main_grad", None)
            if grad is not None:
                tensors.append(grad)
        for name in ("buffers", "expert_parallel_buffers"):  # Megatron DDP's flat buffers
            buffers = getattr(self.model, name, None)
            for buffer in buffers if isinstance(buffers, list) else []:
                tensors += [t for t in (buffer.param_data, buffer.grad_data) if t is not None]
        return tensors + (optimizer_tensors(self.optimizer) if self.optimizer is not None else [])

    def offload(self) -> dict[str, float]:
        """Move params, grads and optimizer state to host memory; returns timings and bytes."""
        return self._offloader.offload(self._state_tensors())

    def onload(self) -> dict[str, float]:
        """Bring back what :meth:`offload` moved; returns timings and bytes."""
        return self._offloader.onload()

    # ----- weight export -----
    def export_hf(self, target_tp: int = 1, target_rank: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named weights for vLLM rollout rank ``target_rank`` of ``target_tp``. Collective.

        Every rank must exhaust the iterator; the tensors come out on global rank 0 only, on the
        model's device (a GPU when there is one) and in the model's dtype. They
        may alias live parameters (no copy is made where none is needed): consume or copy them
        before the next ``train_step``. When the iterator is exhausted, ``last_export_seconds``
        holds the time it took (the consumer's time included).
        """
        start = time.perf_counter()
        yield from megatron_export.export_hf(self.gpt, self.shape, self.par, target_tp, target_rank)
        self.last_export_seconds = time.perf_counter() - start

    def save_hf(self, out_dir: str | Path, config_dir: str | Path) -> Path:
        """The weights as a HF directory (`interface.save_hf_dir`). Collective; the export rank writes."""
        from tandem.sidecars.trainer.engines.interface import save_hf_dir

        return save_hf_dir(self, out_dir, config_dir)

    def load_hf_weights(self, source: Path | Callable[[str], torch.Tensor]) -> int:
        """Copy HF-named weights (a directory, or a name -> tensor loader such as a published version) into
        this rank's shards; a critic's value head is left as it is. Returns how many tensors were loaded."""
        skip = (VALUE_HEAD,) if self.value_head else ()
        return megatron_build.load_hf_weights(self.gpt, source, self.shape, self.par, skip=skip)

    @property
    def is_export_rank(self) -> bool:
        return self.par.dp_rank == 0 and self.par.tp_rank == 0 and self.par.pp_rank == 0

    def export_adapters(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise EngineError(NO_LORA)

    def adapter_config(self) -> dict[str, Any]:
        raise EngineError(NO_LORA)

    def load_adapter_version(self, tensors: Callable[[str], torch.Tensor]) -> int:
        raise EngineError(f"this version holds LoRA adapters only: {NO_LORA}")

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's Megatron parameters (shards), unwrapped names."""
        yield from self.gpt.named_parameters()
