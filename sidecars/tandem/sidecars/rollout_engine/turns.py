"""Continuous batching of multi-turn work on the rollout engine's vLLM: turns are added as they become ready.

Role: a multi-turn rollout alternates model turns with work outside the model (tool calls, an environment's
step). Run as rounds of `generate`, every trajectory would wait for the slowest one's tools and the batch
would empty out turn by turn. Here every turn is a request in vLLM's own engine loop (`LLMEngine.add_request`
/ `step`): when one finishes, `react` gets it and returns a future of the turns that follow (computed on the
caller's worker threads); they join the running batch as soon as they are ready, while the other
trajectories keep decoding. Token ids in, token ids out: prompts are ids, never text; a vision-language model's
turn carries every picture of its conversation so far (vLLM expands each placeholder to its image tokens, and
never samples the image token). The engine's lock is
held throughout (`RolloutEngine.serving`), so no version changes in the middle; the served LoRA adapter (if
any) samples every turn. A `react` that raises aborts every running request and the error propagates.
`TurnLoop` is the same batch fed from any thread: the OpenAI-compatible endpoint's calls, which agents make
one at a time per trajectory, each `submit` joining the running batch; its loop holds the engine only while
there is work, so updates go in between.
Caller: the rollout's multi-turn driver (tandem.sidecars.envs.multi_turn), the OpenAI endpoint
(tandem.sidecars.rollout.openai_api), tests.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.sidecars.rollout_engine.generation import completion, never_sample, pictures_of, sampling_params
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.spec.trainer import image_token


@dataclass(frozen=True)
class Turn:
    key: Hashable  # the caller's: which trajectory, which turn
    prompt_ids: list[int]  # everything so far (the first prompt, then every segment)
    max_tokens: int
    pictures: tuple[Any, ...] = ()  # a vision-language model's: every picture so far, one per image placeholder
    picture_tokens: int = 0  # the tokens vLLM expands those placeholders to, beyond the placeholders themselves


React = Callable[[Turn, Completion], "Future[list[Turn]]"]
_ids = itertools.count()


def _add_request(core: Any, turn: Turn, base: Any, lora: Any) -> str:
    """`turn` as a request of vLLM's engine `core` with a clone of SamplingParams `base`; its request id."""
    from vllm.inputs import TokensPrompt

    limit = int(core.model_config.max_model_len)
    held = len(turn.prompt_ids) + turn.picture_tokens
    if held + 1 > limit or turn.max_tokens < 1:
        raise errors.PromptTooLong(f"turn {turn.key!r}: {held} prompt tokens and "
                                   f"max_tokens {turn.max_tokens} do not fit max_model_len {limit}")
    params = never_sample(base.clone(), image_token(core.model_config.hf_config))
    params.max_tokens = min(turn.max_tokens, limit - held)
    rid = f"turn-{next(_ids)}"
    prompt = TokensPrompt(prompt_token_ids=list(turn.prompt_ids), **pictures_of(turn.pictures))
    core.add_request(rid, prompt, params, lora_request=lora)
    return rid


def run_turns(engine: Any, first: Sequence[Turn], options: SamplingOptions, react: React) -> int:
    """Serve `first` and every turn `react` adds until none is running or pending; returns the turns served.
    `engine` is a RolloutEngine; `options` apply to every turn but max_tokens (each turn's own)."""
    base = sampling_params(options, 1, None)  # no seed: one per turn would repeat samples of equal prompts
    served = 0
    with engine.serving() as (llm, lora):
        core = llm.llm_engine
        live: dict[str, Turn] = {}
        pending: set[Future[list[Turn]]] = set()

        def add(turn: Turn) -> None:
            live[_add_request(core, turn, base, lora)] = turn

        try:
            for turn in first:
                add(turn)
            while live or pending:
                for fut in [f for f in pending if f.done()]:
                    pending.discard(fut)
                    for turn in fut.result():
                        add(turn)
                if live:
                    for out in core.step():
                        if out.finished and out.request_id in live:
                            served += 1
                            pending.add(react(live.pop(out.request_id), completion(out, out.outputs[0])))
                elif pending:
                    wait(pending, return_when=FIRST_COMPLETED)
        except BaseException:
            if live:
                core.abort_request(list(live))
            for fut in pending:
                fut.cancel()
            raise
    return served


Served = tuple[Completion, "int | None"]  # a turn's completion and the weight version that sampled it


class TurnLoop:
    """Turns submitted from any thread join vLLM's running batch; each gets its completion and the version
    that sampled it. A loop thread runs while turns are pending and lets go of the engine when none are."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[tuple[Turn, SamplingOptions, Future[Served]]] = queue.SimpleQueue()
        self._state = threading.Lock()
        self._running = False

    def submit(self, turn: Turn, options: SamplingOptions) -> Future[Served]:
        """`turn` sampled with `options` (but max_tokens: the turn's); a bad turn fails its future only."""
        fut: Future[Served] = Future()
        with self._state:
            self._inbox.put((turn, options, fut))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="turn-loop", daemon=True).start()
        return fut

    def _run(self) -> None:
        live: dict[str, Future[Served]] = {}
        try:
            with self.engine.serving() as (llm, lora):
                core, version = llm.llm_engine, self.engine.version
                while True:
                    with self._state:
                        if not live and self._inbox.empty():
                            self._running = False
                            return
                    while not self._inbox.empty():
                        turn, options, fut = self._inbox.get()
                        if fut.set_running_or_notify_cancel():
                            try:
                                live[_add_request(core, turn, sampling_params(options, 1, options.seed), lora)] = fut
                            except Exception as e:  # noqa: BLE001 - that turn's caller gets it, not the loop
                                fut.set_exception(e)
                    for out in core.step() if live else ():
                        if out.finished and out.request_id in live:
                            live.pop(out.request_id).set_result((completion(out, out.outputs[0]), version))
        except BaseException as e:
            with self._state:
                self._running = False
                pending = list(live.values())
                while not self._inbox.empty():
                    pending.append(self._inbox.get()[2])
            for fut in pending:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
