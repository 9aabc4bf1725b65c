"""The trainer's view of any transformers causal LM: log-probs, train steps, offload, export, on FSDP2.

Role: the `trainer.engine: hf` implementation of the trainer-engine interface (:mod:`.interface`), next to
:class:`~.megatron_engine.MegatronEngine`, for the model families Megatron has no mapping for (Gemma,
Phi, Mistral, OLMo, ...): whatever `AutoModelForCausalLM` loads. Built by `engine_choice.build_engine`; the
driver calls the same methods on either engine. Data parallel over every rank of the job with torch's
FSDP2 (`fully_shard` on each decoder layer, then the whole model; gloo on CPU, NCCL on GPU): each rank
holds 1/N of the fp32 weights, gradients and Adam's state; a `trainer.dtype` below float32 computes in
it (FSDP2's mixed precision, gradients reduced in float32). No tensor or pipeline parallelism.

Batches are the Megatron engine's (`micro_batches`): packed rows with `segment_ids` and optionally
`prefix_ids` (shared prompts); attention gets the same block-diagonal mask (`packing.allowed_attention`)
as a 4-D boolean mask, positions restart per sample (or follow the batch's `position_ids`), so packed ==
unpacked. The output layer runs on the scored positions only, a chunk at a time (`chunked_logprobs`), in
place of the model's own head, when that head is a plain linear map (no bias, no logit soft-capping or
scaling); otherwise the model's logits are used whole. Log-probs use the Megatron engine's layout: entry t
is log p(token t | its sample before t), 0 at each sample's first token and in padding. A vision-language
model (llava, qwen2_5_vl: `AutoModelForImageTextToText`) gets each micro-batch's pictures, and for Qwen2.5-VL
each packed sample's own 3-D positions, from `vision_inputs.py`.

Every method that touches the model is collective (FSDP2 gathers each layer's weights in every forward):
each rank runs the same number of micro-batches, padding with zero-weight ones where its share is short.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from tandem.sidecars.trainer.engines import common, micro_batches, vision_inputs
from tandem.sidecars.trainer.engines import lora as lora_weights
from tandem.sidecars.trainer.engines.chunked_logprobs import chunked_logprobs
from tandem.sidecars.trainer.engines.common import EngineError, Parallelism
from tandem.sidecars.trainer.engines.heads import aligned
from tandem.sidecars.trainer.engines.hf_weights import HFWeights, local_shard, whole_tensor
from tandem.sidecars.trainer.engines.offload import HostOffloader, optimizer_tensors
from tandem.spec.trainer import IMAGE_TOKEN_BIAS, image_token, vision_language

LossFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]
LANGUAGE_MODEL = "model.language_model"  # a vision-language model's language model (transformers 5's LLaVA and
# Qwen2.5-VL layouts)


@dataclasses.dataclass(frozen=True)
class HFShape:
    """What the loop reads of a model's architecture (`ModelShape`'s fields of the same names)."""

    family: str  # model_type
    hidden: int
    vocab: int
    tie_embeddings: bool

    @classmethod
    def of(cls, model: Any) -> HFShape:
        """The shape of a loaded model (before sharding: the tie is read off the parameters themselves)."""
        text = model.config.get_text_config()
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        return cls(family=str(model.config.model_type), hidden=int(text.hidden_size), vocab=int(text.vocab_size),
                   tie_embeddings=bool(tied))


def _plain_head(model: Any) -> bool:
    """Whether logits are exactly `hidden @ lm_head.weight.T` (so the chunked head may replace it)."""
    head = model.get_output_embeddings()
    config = model.config
    return (isinstance(head, torch.nn.Linear) and head.bias is None
            and not getattr(config, "final_logit_softcapping", None) and not getattr(config, "logit_scale", None))


def _has(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def start_process_group() -> tuple[int, int]:
    """torch.distributed up (gloo on CPU, NCCL on GPU, as the Megatron engine's); (world size, rank)."""
    common.start_process_group()
    return dist.get_world_size(), dist.get_rank()


class HFEngine(HFWeights):
    """A transformers model sharded by FSDP2 over the job's ranks, with its AdamW optimizer; its weights in and
    out by HF name come from `HFWeights` (hf_weights.py)."""

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer | None, shape: HFShape, par: Parallelism,
                 micro_batch_size: int, micro_batch_tokens: int | None, clip_grad: float, compute_dtype: torch.dtype
                 ) -> None:
        self.model, self.optimizer, self.shape, self.par = model, optimizer, shape, par
        self.micro_batch_size, self.micro_batch_tokens = micro_batch_size, micro_batch_tokens
        self.clip_grad, self.compute_dtype = clip_grad, compute_dtype
        self.last_step_rows = 0
        self.last_export_seconds = 0.0
        self.temperature = 1.0  # the sampler's (start.create sets rollout.temperature): logits / temperature
        self.plain_head = _plain_head(model)
        self.image_token = image_token(model.config)  # a vision-language model's: sampled and scored pushed down
        self.lora_scale = lora_weights.scale(model) if hasattr(model, "peft_config") else None
        self.model_dir: Path | None = None  # the base model's directory (LoRA's frozen weights)
        self.last_adapters: dict[str, torch.Tensor] | None = None  # LoRA: the adapters of the last export
        self._offloader = HostOffloader()

    # ----- construction -----
    @classmethod
    def from_hf(cls, model_dir: str | Path, *, lr: float = 1e-6, seed: int = 0, dtype: torch.dtype = torch.float32,
                weight_decay: float = 0.0, clip_grad: float = 1.0, micro_batch_size: int = 1,
                micro_batch_tokens: int | None = None, trainable: bool = True, value_head: bool = False,
                recompute: bool = False, lora: Any = None, frozen: tuple[str, ...] = ()) -> HFEngine:
        """Load `model_dir` with transformers (float32 master weights) and shard it over every rank.

        `trainable=False` builds a forward-only engine. `recompute` turns on the model's gradient
        checkpointing (each decoder layer recomputed in the backward). `lora` (`spec.models.Lora`) trains
        adapters on the frozen model (`lora.py`; a vision-language model's in its language model): the optimizer
        holds them only, and versions carry the adapters or the merged weights. `frozen` (trainer.freeze:
        visionTower, projector) leaves a vision-language model's parts out of the optimizer.
        A value head (PPO's critic) is Megatron's only: refused here."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        if value_head:
            raise EngineError("the hf trainer engine has no value head: PPO with critic: true needs "
                              "trainer.engine megatron")
        model_dir = Path(model_dir)
        world, rank = start_process_group()
        torch.manual_seed(seed)
        vision = vision_language(str(model_dir))
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        try:
            model = auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        except (OSError, ValueError) as exc:
            raise EngineError(f"transformers cannot load {model_dir}: {exc}") from exc
        shape = HFShape.of(model)
        # the weights stay on the host until sharded: fully_shard moves each rank's shard, not the whole model,
        # to the mesh's device
        device = common.device()
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        for part in frozen:  # a vision-language model's tower or projector: no gradient, no optimizer state
            names = vision_inputs.FROZEN_PARTS.get(shape.family, {}).get(part, ())
            modules = [model.model.get_submodule(n) for n in names if _has(model.model, n)]
            if not modules:
                raise EngineError(f"trainer.freeze: {model_dir} (model_type {shape.family}) has no {part}")
            for module in modules:
                module.requires_grad_(False)
        if lora is not None:  # on a vision-language model, in its language model only
            try:
                model = lora_weights.wrap(model, lora, within=LANGUAGE_MODEL if vision else None)
            except ValueError as exc:
                raise EngineError(str(exc)) from exc
        mesh = init_device_mesh(device.type, (world,))
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else \
            MixedPrecisionPolicy()
        layers = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in layers:
                fully_shard(module, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        par = Parallelism(tp=1, pp=1, dp=world, ep=1, tp_rank=0, pp_rank=0, dp_rank=rank, ep_rank=0, fsdp=True)
        optimizer = None
        if trainable:
            trained = [p for p in model.parameters() if p.requires_grad]  # with LoRA, the adapters only
            optimizer = torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)
        else:
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
        engine = cls(model, optimizer, shape, par, micro_batch_size, micro_batch_tokens, clip_grad, dtype)
        engine.model_dir = model_dir
        return engine

    # ----- forward -----
    def _micro_batches(self, batch: Any, micro_batch_size: int | None) -> list[Any]:
        rows, cols = micro_batches.require(batch, "input_ids").shape
        mbs = micro_batches.rows_per_micro_batch(rows, cols, micro_batch_size or self.micro_batch_size,
                                                 self.micro_batch_tokens)
        device = common.device()
        return [micro_batches.to_device(mb, device) for mb in micro_batches.split_rows(batch, mbs)]

    def _equalized(self, mbs: list[Any], filler: Any) -> tuple[list[Any], int]:
        """`mbs` padded with `filler` micro-batches to the largest count of any rank (FSDP2's gathers run per
        forward); (the list, how many of it are this rank's own)."""
        own = len(mbs)
        if self.par.dp == 1:
            return mbs, own
        count = torch.tensor([own], dtype=torch.int64, device=common.device())
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return mbs + [filler] * (int(count) - own), own

    def _mask(self, mb: Any) -> torch.Tensor:
        from tandem.sidecars.algorithms.packing import allowed_attention

        seg = micro_batches.require(mb, "segment_ids")
        return allowed_attention(seg, micro_batches.field(mb, "prefix_ids"))  # [rows, 1, len, len], True: attend

    @contextmanager
    def _scoring_head(self, mb: Any, scored_only: bool, out: list[torch.Tensor]) -> Iterator[None]:
        """While active, the model's output layer returns log-probs `[rows, len]` (the layout above) of the
        positions the loss reads, computed a chunk at a time; appended to `out` as well."""
        head = self.model.get_output_embeddings()
        ids = micro_batches.require(mb, "input_ids")
        mask = micro_batches.field(mb, "loss_mask") if scored_only else None
        pushed = () if self.image_token is None else (self.image_token,)

        def forward(hidden: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
            weight = head.weight
            if self.temperature != 1.0:  # a plain linear head: (h / T) W^T = logits / T
                hidden = hidden / self.temperature
            if mask is not None:  # labels layout: position t scores token t + 1
                where = mask > 0
                labels = micro_batches.require(mb, "labels")
                lp = chunked_logprobs(hidden[where], weight, labels[where], vocab_start=0, valid=weight.shape[0],
                                      pushed=pushed)
                placed = torch.zeros(where.shape, dtype=lp.dtype, device=lp.device).masked_scatter(where, lp)
                result = torch.cat([torch.zeros_like(placed[:, :1]), placed[:, :-1]], dim=1)
            else:
                rows, cols, width = hidden.shape
                flat = hidden[:, :-1].reshape(-1, width)
                lp = chunked_logprobs(flat, weight, ids[:, 1:].reshape(-1), vocab_start=0, valid=weight.shape[0],
                                      pushed=pushed)
                result = aligned(lp.reshape(rows, cols - 1), mb)
            out.append(result)
            return result

        head.forward = forward
        try:
            yield
        finally:
            del head.forward

    def _inputs(self, mb: Any) -> dict[str, Any]:
        """The model's keyword arguments for a packed micro-batch: ids, the block-diagonal mask, per-sample
        positions (or the batch's own, with shared prompts); a vision-language model's pictures and, for
        Qwen2.5-VL, its 3-D positions (`vision_inputs.model_inputs`)."""
        positions = micro_batches.field(mb, "position_ids")
        if positions is None:
            positions = micro_batches.position_ids(micro_batches.require(mb, "segment_ids"))
        ids = micro_batches.require(mb, "input_ids")
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": self._mask(mb), "position_ids": positions,
                                  "use_cache": False}
        rows = getattr(mb, "images", None)  # a vision-language model's pictures, per row in order (pictures.py)
        try:
            inputs |= vision_inputs.model_inputs(self.model.config, self.image_token, ids, positions,
                                                 micro_batches.require(mb, "segment_ids"),
                                                 micro_batches.field(mb, "prefix_ids"), rows or [], self.compute_dtype)
        except ValueError as e:
            raise EngineError(str(e)) from None
        return inputs

    def _forward(self, mb: Any, scored_only: bool) -> torch.Tensor:
        """Log-probs `[rows, len]` of one micro-batch (with gradient when grad is enabled)."""
        if self.plain_head:
            got: list[torch.Tensor] = []
            with self._scoring_head(mb, scored_only, got):
                self.model(**self._inputs(mb))
            return got[-1]
        logits = self.model(**self._inputs(mb)).logits.float() / self.temperature
        if self.image_token is not None:
            logits[..., self.image_token] += IMAGE_TOKEN_BIAS
        ids = micro_batches.require(mb, "input_ids")
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        return aligned(-nll, mb)

    def token_logprobs(self, batch: Any, micro_batch_size: int | None = None, scored_only: bool = False
                       ) -> torch.Tensor:
        """Log-probs `[rows, len]` (float32, CPU); no gradient. `scored_only` (a batch with a `loss_mask`): only
        the tokens the mask scores, 0 elsewhere. As `MegatronEngine.token_logprobs`."""
        self.model.eval()
        mbs = self._micro_batches(batch, micro_batch_size)
        runs, own = self._equalized(mbs, micro_batches.take_rows(mbs[0], 0, 1) if mbs else None)
        scored = scored_only and micro_batches.field(batch, "loss_mask") is not None
        outs = []
        with torch.no_grad():
            for mb in runs:
                outs.append(self._forward(mb, scored).float().cpu())
        self._resharded()
        return torch.cat(outs[:own]) if own else torch.empty(0)

    def logits(self, batch: Any) -> torch.Tensor:
        """Full-vocabulary logits `[rows, len, vocab]` (float32, CPU)."""
        self.model.eval()
        mb = micro_batches.to_device(batch, common.device())
        with torch.no_grad():
            out = self.model(**self._inputs(mb))
        self._resharded()
        return out.logits.float()[..., : self.shape.vocab].cpu()

    def greedy_generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of one prompt (a full forward per token; for tests)."""
        tokens = list(prompt_ids)
        for _ in range(max_new_tokens):
            ids = torch.tensor([tokens], dtype=torch.long)
            tokens.append(int(self.logits({"input_ids": ids, "segment_ids": torch.ones_like(ids)})[0, -1].argmax()))
        return tokens[len(prompt_ids):]

    # ----- training -----
    def train_step(self, batch: Any, loss_fn: LossFn, micro_batch_size: int | None = None,
                   reduction: Literal["mean", "sum"] = "mean") -> dict[str, float]:
        """One optimizer step over the global `batch`, each rank on its share of the rows; the same contract
        and metrics as `MegatronEngine.train_step` (`loss`, the mean of each metric over micro-batches,
        `grad_norm` before clipping, `update_ok`, `step_seconds`)."""
        if self.optimizer is None:
            raise EngineError("this engine was built with trainable=False")
        start = time.perf_counter()
        self.model.train()
        mbs, counted, self.last_step_rows = micro_batches.train_share(
            batch, self.par.dp, self.par.dp_rank, lambda part: self._micro_batches(part, micro_batch_size))
        runs, _ = self._equalized(mbs, mbs[0])
        total = int(common.dp_sum(self.par, [float(counted)])[0])
        # FSDP2 averages gradients over the ranks: x dp turns that into the sum over every rank's micro-batches
        scale = self.par.dp * (1.0 if reduction == "sum" else 1.0 / max(total, 1))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for i, mb in enumerate(runs):
            self.model.set_requires_gradient_sync(i == len(runs) - 1)  # reduce-scatter once, after the last
            loss, metrics = loss_fn(self._forward(mb, scored_only=True), mb)
            weight = 1.0 if i < counted else 0.0  # a filler micro-batch joins the collectives only
            (loss * (scale * weight)).backward()
            values = {k: float(v) for k, v in metrics.items()} | {"loss": float(loss.detach())}
            common.accumulate(sums, values, weight)  # every rank the same keys (each runs at least one micro-batch)
        self._resharded()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        grad_norm = float(whole_tensor(norm))
        update_ok = bool(torch.isfinite(torch.tensor(grad_norm)))
        if update_ok:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics_out = common.step_metrics(self.par, sums, total, reduction)
        metrics_out.update(grad_norm=grad_norm, update_ok=float(update_ok), step_seconds=time.perf_counter() - start)
        return metrics_out

    def set_lr(self, lr: float) -> None:
        if self.optimizer is None:
            raise EngineError("this engine was built with trainable=False")
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ----- memory phases -----
    def _state_tensors(self) -> list[torch.Tensor]:
        self._resharded()
        tensors = [local_shard(p) for p in self.model.parameters()]
        tensors += [local_shard(p.grad) for p in self.model.parameters() if p.grad is not None]
        if self.optimizer is not None:
            tensors += [local_shard(t) for t in optimizer_tensors(self.optimizer)]
        return tensors

    def offload(self) -> dict[str, float]:
        """Move this rank's weight, gradient and optimizer shards to host memory; timings and bytes."""
        return self._offloader.offload(self._state_tensors())

    def onload(self) -> dict[str, float]:
        return self._offloader.onload()
