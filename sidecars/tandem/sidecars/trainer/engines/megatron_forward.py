"""The forward passes of the Megatron engine: packed batches through Megatron's schedules, to log-probs or values.

Role: `MegatronForward` holds a built Megatron model and what its forwards need (the parallel layout, the
micro-batch sizes, the output-head settings, the MoE routers that replay routing) and runs them: micro-batches
through Megatron's forward-backward schedules (`_run`, which the train step also uses), each micro-batch's
forward (`_forward_step`: positions, shared-prompt RoPE, sequence-parallel padding, routing replay, the output
layer on the scored positions only) and what the losses see (`_outputs`: token log-probs, or a critic's
values); `token_logprobs`, `logits` and `greedy_generate` are the forward-only entry points. Every method is
collective. Caller: `megatron_engine.MegatronEngine`, which adds construction, the train step, offload and
export.

A mixture-of-experts model under tensor parallelism runs with Megatron's sequence parallelism (its MoE layers
train only so): each micro-batch is padded to a multiple of the TP size (segment 0) and its outputs cut back.
Batches are packed: the algorithms' ``PackedBatch`` or a mapping with ``input_ids`` and
``segment_ids`` of shape ``[rows, row_len]`` (see :mod:`.micro_batches`); attention never crosses a
``segment_ids`` boundary (a block-diagonal causal mask). Megatron's rotary embedding numbers the
positions of the whole row, which gives the same attention scores as per-sample positions
because RoPE scores depend only on relative positions (packed == unpacked is tested).

Log-probs are aligned to the token they score: position t holds log p(token t | its sample's
tokens before t), 0 at each sample's first token and in padding. The algorithms' ``labels``
layout (position t scores token t + 1) is this shifted left by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from tandem.checkpoint_engine.convert import ModelShape
from tandem.sidecars.trainer.engines import common, heads, megatron_build, micro_batches, routing_replay
from tandem.sidecars.trainer.engines.common import EngineError, Parallelism
from tandem.sidecars.trainer.engines.offload import HostOffloader


class MegatronForward:
    """A built Megatron model (with its DDP wrapper and optimizer when trainable) and its forward passes."""

    def __init__(
        self,
        model: Any,
        gpt: Any,
        optimizer: Any,
        shape: ModelShape,
        par: Parallelism,
        config: Any,
        micro_batch_size: int,
        value_head: bool = False,
        micro_batch_tokens: int | None = None,
    ) -> None:
        self.model, self.gpt, self.optimizer = model, gpt, optimizer
        self.value_head = value_head
        self.shape, self.par, self.config = shape, par, config
        self.last_step_rows = 0  # rows of the last train_step's batch this dp rank trained on
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens  # trainer.microBatchTokens: fewer rows when rows are long
        self.last_export_seconds = 0.0
        self._offloader = HostOffloader()
        # train steps run the output layer on the loss's positions only (see heads.only_scored);
        # False runs it everywhere (the reference the tests compare against)
        self.score_only_loss_positions = True
        self._scoring = False  # inside a train step or forward that does
        # ... and there, the output layer and log-softmax run a chunk of positions at a time
        # (chunked_logprobs): no [positions, vocab] logits; False computes them whole (tests compare)
        self.chunked_head = True
        self.temperature = 1.0  # the sampler's (start.create sets rollout.temperature): logits / temperature
        # rows longer than this attend per sample (segment_attention: memory linear in the row); shorter
        # ones through the dense mask; tests set it to compare the two
        self.dense_max_tokens = micro_batches.DENSE_MAX_TOKENS
        self._head: torch.Tensor | None = None  # the output weight while a micro-batch's loss runs
        # this stage's MoE routers that replay a batch's routed_experts (empty: no replay)
        self._routers = routing_replay.routers(gpt, megatron_build.layer_numbers(gpt))

    # ----- forward -----
    def _micro_batches(self, batch: Any, micro_batch_size: int | None) -> list[Any]:
        rows, cols = micro_batches.require(batch, "input_ids").shape
        mbs = micro_batches.rows_per_micro_batch(rows, cols, micro_batch_size or self.micro_batch_size,
                                                 self.micro_batch_tokens, equal=self.par.pp > 1)
        if self.par.pp > 1 and rows % mbs:
            raise EngineError(f"with pipeline parallelism, rows ({rows}) must be a multiple of {mbs}")
        device = common.device()
        return [micro_batches.to_device(mb, device) for mb in micro_batches.split_rows(batch, mbs)]

    def _forward_step(
        self, loss_fn: Callable[..., Any] | None, data_iterator: Iterator[Any], model: Any
    ) -> tuple[torch.Tensor, Any]:
        mb = next(data_iterator)
        seg = micro_batches.require(mb, "segment_ids")
        positions = micro_batches.field(mb, "position_ids")
        if positions is None:
            positions = micro_batches.position_ids(seg)
        index = heads.scored_positions(mb) if self._scoring else None
        prefix = micro_batches.field(mb, "prefix_ids")
        ids = micro_batches.require(mb, "input_ids")
        cols, sp = ids.shape[1], bool(self.config.sequence_parallel)
        if sp:  # each TP rank takes an equal part of the sequence: padding columns (segment 0) at the end
            ids, seg, positions, prefix = micro_batches.pad_columns((ids, seg, positions, prefix), self._length(cols))
        rope = None if prefix is None else positions  # shared prompts: RoPE at the batch's positions
        self._replay(mb, cols)
        # sequence parallelism: scored positions always take the chunked head (the output layer would
        # gather a sequence the cut has already gathered)
        chunked = index is not None and (self.chunked_head or sp) and bool(self.gpt.post_process)
        scoring: AbstractContextManager[list[torch.Tensor]] = (
            heads.hidden_out(self.gpt.output_layer) if chunked else nullcontext([]))
        with heads.only_scored(self.gpt.decoder, index, sp), micro_batches.rope_at(self.gpt, rope), \
                scoring as head:
            output = model(ids, positions, micro_batches.attention_input(seg, prefix, self.dense_max_tokens))
        if loss_fn is None:
            return output, None
        return output, partial(self._with_head, loss_fn, mb, head[-1] if head else None, cols)

    def _replay(self, mb: Any, cols: int) -> None:
        """Set this micro-batch's routing on every MoE router (a batch without ``routed_experts``: the
        routers choose); an engine built without replay refuses a batch that carries routing."""
        routed = micro_batches.field(mb, "routed_experts")
        if routed is None:
            routing_replay.release(self._routers)
            return
        if not self._routers:
            raise EngineError("the batch carries routed_experts but this engine was built without routing replay "
                              "(algorithm.routingReplay)")
        routing_replay.check_batch(routed, self.shape.num_layers, self.shape.moe_top_k, self.shape.num_experts)
        target = routing_replay.targets(routed, self._length(cols), self.par.tp, self.par.tp_rank,
                                        bool(self.config.sequence_parallel))
        routing_replay.replay(self._routers, target.to(common.device()))

    def _length(self, cols: int) -> int:
        """The sequence length the model runs for rows of `cols` tokens: a multiple of the TP size under
        sequence parallelism (MoE with tensor parallelism), else `cols`."""
        tp = self.par.tp if self.config.sequence_parallel else 1
        return -(-cols // tp) * tp

    def _with_head(self, loss_fn: Callable[..., Any], mb: Any, head: torch.Tensor | None, cols: int,
                   output: torch.Tensor) -> Any:
        """The micro-batch's loss, with `_outputs` told whether `output` is hidden states (and the
        output weight to score them with) or logits (of the first `cols` positions: padding cut).
        Megatron's schedules call it right after the micro-batch's forward."""
        if head is None and self.config.sequence_parallel:
            output = output[:, :cols]
        self._head = head
        try:
            return loss_fn(mb, output)
        finally:
            self._head = None

    def _run(
        self, batches: list[Any], loss: Callable[..., Any] | None, forward_only: bool
    ) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        rows, cols = micro_batches.require(batches[0], "input_ids").shape
        try:
            return list(
                get_forward_backward_func()(
                    forward_step_func=partial(self._forward_step, loss),
                    data_iterator=iter(batches),
                    model=[self.model],
                    num_microbatches=len(batches),
                    seq_length=self._length(cols),
                    micro_batch_size=rows,
                    forward_only=forward_only,
                )
            )
        finally:
            routing_replay.release(self._routers)

    def _outputs(self, logits: torch.Tensor, mb: Any) -> torch.Tensor:
        """What the losses and forwards see: values for a critic, token log-probs otherwise."""
        if self.value_head:
            return heads.values(logits, mb, self.par)
        if self.temperature != 1.0:  # logits, or the hidden states a linear head turns into them: / T either way
            logits = logits / self.temperature
        if self._head is not None:  # hidden states of the scored positions (only_scored + hidden_out)
            return heads.scored_logprobs_from_hidden(logits, self._head, mb, self.shape, self.par)
        if self._scoring and micro_batches.field(mb, "loss_mask") is not None:  # cut by only_scored
            return heads.scored_logprobs(logits, mb, self.shape, self.par)
        return heads.logprobs(logits, mb, self.shape, self.par)

    def token_logprobs(self, batch: Any, micro_batch_size: int | None = None,
                       scored_only: bool = False) -> torch.Tensor:
        """Log-probs ``[rows, len]`` (float32, CPU) on every rank; no gradient.

        ``out[r, t] = log p(input_ids[r, t] | the tokens of its sample before t)``; 0 at the
        first token of each sample and in padding. (``out[:, 1:]`` is the algorithms' ``labels``
        layout without its last column.) A critic (``value_head``) returns its values, same layout.
        ``scored_only`` (a batch with a ``loss_mask``, e.g. the completions of a ``PackedBatch``): only
        the tokens the mask scores get log-probs, 0 elsewhere, and the output layer runs on those
        positions only, a chunk at a time, as in :meth:`train_step`.
        """
        self.model.eval()
        mbs = self._micro_batches(batch, micro_batch_size)
        scoring = scored_only and micro_batches.field(batch, "loss_mask") is not None
        self._scoring = self.score_only_loss_positions and scoring and not self.value_head \
            and bool(self.gpt.post_process)
        try:
            with torch.no_grad():
                outs = self._run(
                    mbs, lambda mb, logits: (torch.zeros(()), {"lp": self._outputs(logits, mb)}), True
                )
        finally:
            self._scoring = False
        result = torch.cat([o["lp"] for o in outs]) if outs else torch.empty(0)
        size = tuple(micro_batches.require(batch, "input_ids").shape)
        return self._from_last_stage(result, size, torch.float32).cpu()

    def logits(self, batch: Any) -> torch.Tensor:
        """Full-vocabulary logits ``[rows, len, vocab]`` (float32, CPU) on every rank."""
        from megatron.core import tensor_parallel as mtp

        self.model.eval()
        rows, cols = micro_batches.require(batch, "input_ids").shape
        mbs = self._micro_batches(batch, rows)
        with torch.no_grad():
            outs = self._run(mbs, lambda mb, lg: (torch.zeros(()), {"lg": lg.float()}), True)
        result = torch.empty(0)
        if outs:
            result = mtp.gather_from_tensor_model_parallel_region(outs[0]["lg"])[..., : self.shape.vocab]
        return self._from_last_stage(result, (rows, cols, self.shape.vocab), torch.float32).cpu()

    def _from_last_stage(
        self, tensor: torch.Tensor, size: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        if self.par.pp == 1:
            return tensor
        from megatron.core import parallel_state as ps

        buffer = (
            tensor.contiguous()
            if ps.is_pipeline_last_stage()
            else torch.empty(size, dtype=dtype, device=common.device())
        )
        dist.broadcast(
            buffer,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
        return buffer

    def greedy_generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of one prompt (full forward per token; for tests)."""
        tokens = list(prompt_ids)
        for _ in range(max_new_tokens):
            ids = torch.tensor([tokens], dtype=torch.long)
            logits = self.logits({"input_ids": ids, "segment_ids": torch.ones_like(ids)})
            tokens.append(int(logits[0, -1].argmax()))
        return tokens[len(prompt_ids) :]
