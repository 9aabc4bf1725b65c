"""Where an iteration's completions come from: one class per rollout mode behind one interface.

Role: the driver asks its `RolloutSource` for the groups to train on weights `version`:
- `SyncSource` (default): every rollout generates the iteration's prompts with `version`, and the
  iteration waits for the longest completion;
- `PartialSource` (`rollout.partial`): completions cut at the token budget are carried over and
  continued under newer weights (`partial.PartialRollouts`);
- `MultiTurnSource` (`rollout.environment` with turns): trajectories from the rollouts' driver;
- `AsyncSource` (`algorithm.maxStaleness` > 0): a producer thread keeps the rollout-only pods
  generating while the trainer trains (`async_rollouts.AsyncRollouts`), single-turn completions or
  multi-turn trajectories (`trajectory_groups`), one version per batch; with
  `rollout.betweenRollouts: keep` the hybrid pods' rollouts generate too (shared with the driver,
  which then evaluates between batches, through `exclusive`).
A diagnostic, `DelayedSource` (trainer env DIAGNOSTIC_DELAYED_BATCHES=1), is the synchronous loop with the
asynchronous loop's one-version staleness. Each returns finished `Group`s (every completion records the
version of each segment) and the metrics of its mode; `to_samples` turns them into the algorithm's samples
and the rewards' inputs. `make_source` picks one. Caller: `tandem.sidecars.trainer.loop.driver`.

KTO (algorithm.name kto) generates nothing: `LabelledSource` takes the iteration's rows of the
labelled dataset and gives samples directly (not behind `RolloutSource`: there are no groups to
generate or score, and no rollouts in flight), and the rollouts serve evaluation and the probe only.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.algorithms.kto import kl_probes
from tandem.sidecars.rewards.combine import RewardInput
from tandem.sidecars.rollout_engine.contract import decode_images
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import Prompt, PromptDataset, pictures_of
from tandem.sidecars.trainer.loop.data.dataset_files import DatasetError
from tandem.sidecars.trainer.loop.recovery import inflight, resume
from tandem.sidecars.trainer.loop.rollout.async_rollouts import AsyncRollouts, Generate, one_version, single_turn
from tandem.sidecars.trainer.loop.rollout.partial import Group, PartialRollouts, Pending, Segment
from tandem.sidecars.trainer.loop.rollout.rollout_client import RolloutClient
from tandem.spec import seeds
from tandem.spec.models import JobSpec

log = logging.getLogger(__name__)


class RolloutSource(Protocol):
    hybrid_only: bool  # the driver's client holds the hybrid pods' rollouts only
    shared: bool  # the source also generates on the driver's rollouts and loads versions into them

    def exclusive(self, version: int) -> AbstractContextManager[None]:
        """The driver's rollouts to the driver alone, with `version` loaded (shared sources), or
        nothing to do (the driver loads versions itself)."""
        ...

    def next(self, iteration: int, version: int, options: SamplingOptions) -> tuple[list[Group], dict[str, Any]]:
        """The groups to train on weights `version` in `iteration`, and metrics."""
        ...

    def record(self, version: int) -> inflight.Inflight:
        """What is generated but not trained, as a restart should re-generate it."""
        ...

    def published(self, version: int) -> None: ...

    def close(self) -> None: ...


class SyncSource:
    hybrid_only = False  # the driver's own client holds every rollout
    shared = False

    def exclusive(self, version: int) -> AbstractContextManager[None]:
        return nullcontext()

    def __init__(self, spec: JobSpec, dataset: PromptDataset, rollouts: RolloutClient):
        self.spec, self.dataset, self.rollouts = spec, dataset, rollouts

    def next(self, iteration: int, version: int, options: SamplingOptions) -> tuple[list[Group], dict[str, Any]]:
        return self._groups(iteration, version, options), {}

    def more(self, iteration: int, round_: int, version: int, options: SamplingOptions) -> list[Group]:
        """Another round of groups for dynamic sampling: prompts from a stretch of the seeded order no
        iteration reads (round r of iteration i: position i + r x iterations), so a rerun sees the same."""
        return self._groups(iteration + round_ * self.spec.algorithm.iterations, version, options)

    def _generate(self) -> Generate:
        return single_turn(self.spec.algorithm.group_size)

    def _groups(self, position: int, version: int, options: SamplingOptions) -> list[Group]:
        """groupSize completions for each prompt of the dataset's batch at `position`, all of one version."""
        prompts = self.dataset.batch(position, self.spec.rollout.prompts_per_iteration)
        return self._generate()(self.rollouts, prompts, options, version)[0]

    def record(self, version: int) -> inflight.Inflight:
        return inflight.Inflight(version)

    def published(self, version: int) -> None:
        pass

    def close(self) -> None:
        pass


DELAYED_ENV = "DIAGNOSTIC_DELAYED_BATCHES"  # "1" on the trainer container: `DelayedSource` (a diagnostic)


class DelayedSource(SyncSource):
    """A diagnostic, not a mode (the trainer's env DIAGNOSTIC_DELAYED_BATCHES=1, set through spec.podTemplate,
    on a synchronous single-turn job): the synchronous loop with asynchronous k=1's staleness and none of its
    machinery (no producer thread, no second client, no evaluation between batches). Each iteration generates
    the next iteration's prompts with the weights it holds and trains on the batch generated one iteration
    earlier (the first generates two, both with the starting weights, as the producer does), so a batch is one
    version old when trained. Whether such a run learns like sync or like async k=1 tells staleness apart from
    the asynchronous machinery."""

    ahead: list[Group] | None = None

    def next(self, iteration: int, version: int, options: SamplingOptions) -> tuple[list[Group], dict[str, Any]]:
        if self.ahead is None:
            self.ahead = self._groups(iteration, version, options)
        nxt = options.model_copy(update={"seed": seeds.request_seed(self.spec.seed, iteration + 1)})
        groups, self.ahead = self.ahead, self._groups(iteration + 1, version, nxt)
        return groups, {"batch_index": iteration, "batch_version": groups[0].born if groups else version}


TURN_STATS = ("turns", "tool_calls", "tool_errors", "tool_seconds", "tool_results", "pictures_refused")


class MultiTurnSource(SyncSource):
    """Multi-turn trajectories (rollout.environment with turns) from the rollouts' driver, generated
    synchronously (`trajectory_groups`)."""

    def _generate(self) -> Generate:
        return trajectory_groups(self.spec.algorithm.group_size)


def trajectory_groups(group_size: int) -> Generate:
    """groupSize trajectories per prompt from the rollouts' `/v1/trajectories`: each member's completion is
    every token after the first prompt, the model's and the environment's, with its mask; the text the
    rewards judge is the last model turn. Built with the one version the rollouts reported (`version` where
    they report none). Used synchronously (`MultiTurnSource`) and by the asynchronous producer."""
    def generate(rollouts: RolloutClient, prompts: Sequence[Prompt], options: SamplingOptions,
                 version: int) -> tuple[list[Group], set[int | None]]:
        outs, versions = rollouts.trajectories([p.chat for p in prompts], options, n=group_size,
                                               data=[p.fields for p in prompts], expect=version,
                                               **pictures_of(prompts))
        v = one_version(versions, version)
        groups = []
        for prompt, trajectories in zip(prompts, outs, strict=True):
            members = [Pending(t["prompt_ids"], t["completion_ids"], t["logprobs"],
                               [Segment(v, len(t["completion_ids"]))], t["text"],
                               "length" if t["finish"] == "length" else "stop", done=True, mask=t["mask"],
                               turns={k: float(t.get(k, 0.0)) for k in TURN_STATS}, env_reward=t.get("reward"),
                               pictures=tuple(decode_images([t.get("pictures") or []])[0]))
                       for t in trajectories]
            groups.append(Group(prompt, members, born=v))
        return groups, versions
    return generate


def turn_stats(groups: Sequence[Group]) -> dict[str, float]:
    """Per iteration: model turns, tool calls and tool answers that reached the model per trajectory, tool
    errors per call, tool seconds in all; where an environment answered with pictures (or tried to), its pictures
    per trajectory and those refused in all."""
    rows = [m.turns for g in groups for m in g.members if m.turns is not None]
    if not rows:
        return {}
    pictured = any(m.pictures or (m.turns or {}).get("pictures_refused") for g in groups for m in g.members)
    calls = sum(r["tool_calls"] for r in rows)
    return {"turns_mean": sum(r["turns"] for r in rows) / len(rows), "tool_calls_mean": calls / len(rows),
            "tool_results_mean": sum(r.get("tool_results", 0.0) for r in rows) / len(rows),
            "tool_error_frac": sum(r["tool_errors"] for r in rows) / calls if calls else 0.0,
            "tool_seconds": sum(r["tool_seconds"] for r in rows),
            **({"env_pictures_mean": sum(len(m.pictures) for g in groups for m in g.members) / len(rows),
                "env_pictures_refused": sum(r.get("pictures_refused", 0.0) for r in rows)} if pictured else {})}


class PartialSource(SyncSource):
    def __init__(self, spec: JobSpec, dataset: PromptDataset, rollouts: RolloutClient, requeue: Sequence[Prompt]):
        super().__init__(spec, dataset, rollouts)
        partial = spec.rollout.partial
        if partial is None:
            raise ValueError("rollout.partial is not set")
        self.partial = PartialRollouts(token_budget=partial.token_budget, max_tokens=spec.rollout.max_tokens,
                                       max_age=partial.max_age, group_size=spec.algorithm.group_size)
        self.requeue = list(requeue)  # prompts carried when the run stopped: generated afresh

    def next(self, iteration: int, version: int, options: SamplingOptions) -> tuple[list[Group], dict[str, Any]]:
        # n=1 per request, the prompt repeated groupSize times: one seed would repeat one sample
        opts = options.model_copy(update={"seed": None})

        def generate(inputs: list[str | list[int]], limits: list[int]) -> tuple[list[Completion], int]:
            groups, versions = self.rollouts.generate(inputs, opts, n=1, max_tokens=limits, expect=version)
            return [g[0] for g in groups], one_version(versions, version)

        prompts = self.requeue + self.dataset.batch(iteration, self.spec.rollout.prompts_per_iteration)
        out = self.partial.step(generate, prompts, version)
        out.stats["requeued"] = len(self.requeue)
        self.requeue = []
        return out.finished, out.stats

    def record(self, version: int) -> inflight.Inflight:
        return inflight.Inflight(version, prompts=[*(p.index for p in self.requeue), *self.partial.inflight()])


class AsyncSource(SyncSource):
    """The producer on the rollout-only pods (and, shared, on the hybrid pods' too); the driver's
    client holds the hybrid pods' rollouts (evaluation)."""

    hybrid_only = True

    def __init__(self, spec: JobSpec, dataset: PromptDataset, producer: AsyncRollouts,
                 addresses: Callable[[], list[str]], *, shared: bool = False):
        self.spec, self.dataset, self.producer, self.addresses = spec, dataset, producer, addresses
        self.shared = shared

    def exclusive(self, version: int) -> AbstractContextManager[None]:
        return self.producer.exclusive(version) if self.shared else nullcontext()

    def next(self, iteration: int, version: int, options: SamplingOptions) -> tuple[list[Group], dict[str, Any]]:
        self.producer.rollouts_now(self.addresses())  # pods scaled up or down since
        taken = self.producer.take(version)
        b = taken.batch
        return b.groups, {"batch_index": b.index, "batch_version": b.version, "wait_seconds": taken.waited,
                          "batch_generate_seconds": b.seconds,
                          "dropped_completions": sum(len(g.members) for d in taken.dropped for g in d.groups),
                          "wasted_tokens": sum(g.tokens for d in taken.dropped for g in d.groups),
                          **{f"producer_{k}": v for k, v in self.producer.client.faults.take().items()}}

    def record(self, version: int) -> inflight.Inflight:
        return inflight.Inflight(version, next_batch=self.producer.next_batch())

    def published(self, version: int) -> None:
        self.producer.published(version)

    def close(self) -> None:
        self.producer.close()
        self.producer.client.close()


class LabelledSource:
    """KTO's examples: the iteration's `rollout.promptsPerIteration` rows in the dataset's seeded order
    (`PromptDataset.batch`, as prompts are taken, so a resumed run sees the same rows), each a `Sample`
    of the rendered prompt's ids and the completion's (`PromptDataset.labelled`, tokenized as the
    model's reply), labelled by `desirable` and rewarded 1 (desirable) or 0 (so reward_mean is the
    desirable share); after them the batch's KL probes (`kto.kl_probes`), which the Inference phase
    scores like any sample and `KTO.prepare` turns into z0."""

    def __init__(self, dataset: PromptDataset, rows_per_iteration: int):
        if dataset.labelled is None:
            raise DatasetError("kto trains on labelled rows: set dataset.completionField and dataset.labelField")
        if any(p.token_ids is None for p in dataset.prompts) or any(x.token_ids is None for x in dataset.labelled):
            raise DatasetError("kto's rows must be tokenized: load the dataset with the model's tokenizer")
        self.dataset, self.size = dataset, rows_per_iteration

    def next(self, iteration: int) -> tuple[list[Sample], dict[str, Any]]:
        """The iteration's examples followed by their KL probes, and metrics of the batch."""
        labelled = self.dataset.labelled or []
        examples: list[Sample] = []
        for k, prompt in enumerate(self.dataset.batch(iteration, self.size)):
            row = labelled[prompt.index]
            examples.append(Sample(prompt_ids=list(prompt.token_ids or []), completion_ids=list(row.token_ids or []),
                                   group=k, reward=1.0 if row.desirable else 0.0, desirable=row.desirable))
        desirable = sum(1 for s in examples if s.desirable)
        return examples + kl_probes(examples), {"desirable_examples": desirable,
                                                "undesirable_examples": len(examples) - desirable}


def make_source(spec: JobSpec, dataset: PromptDataset, rollouts: RolloutClient, *, registry: SyncRegistry | None,
                token: str, generation: int, version: int, first_iteration: int,
                resumed: inflight.Inflight | None) -> tuple[RolloutSource, RolloutClient]:
    """The job's rollout source, and the client the driver keeps for sync, eval and release (in
    asynchronous mode the hybrid pods' rollouts only)."""
    if spec.rollout.partial is not None:
        requeue = [dataset.prompts[i] for i in (resumed.prompts if resumed else []) if 0 <= i < len(dataset)]
        return PartialSource(spec, dataset, rollouts, requeue), rollouts
    environment = spec.rollout.environment
    multi_turn = environment is not None and environment.type != "single"
    if spec.algorithm.max_staleness == 0 or registry is None:
        if os.environ.get(DELAYED_ENV) == "1" and not multi_turn:
            log.warning("%s=1: training each batch one version after it was generated (a diagnostic)", DELAYED_ENV)
            return DelayedSource(spec, dataset, rollouts), rollouts
        return (MultiTurnSource if multi_turn else SyncSource)(spec, dataset, rollouts), rollouts
    shared = spec.rollout.between_rollouts == "keep"  # the hybrid pods' vLLM stays up while training
    only = resume.rollout_addresses(registry, generation, rollout_only=True)
    hybrid = resume.rollout_addresses(registry, generation, rollout_only=False)
    if not hybrid or not (only or shared):
        log.warning("maxStaleness %d: no rollout-only pod registered and rollout.betweenRollouts is not keep; "
                    "generating synchronously", spec.algorithm.max_staleness)
        return (MultiTurnSource if multi_turn else SyncSource)(spec, dataset, rollouts), rollouts
    rollouts.addresses = hybrid

    def producing() -> list[str]:  # the producer's rollouts now (the pool may have been scaled)
        return resume.rollout_addresses(registry, generation, rollout_only=None if shared else True)

    first = resumed.next_batch if resumed is not None and resumed.next_batch is not None else first_iteration
    options = SamplingOptions(temperature=spec.rollout.temperature, top_p=spec.rollout.top_p,
                              max_tokens=spec.rollout.max_tokens)
    def discover() -> dict[str, str]:
        return resume.rollout_pods(registry, generation, rollout_only=None if shared else True)

    producer = AsyncRollouts(rollouts.like(only + hybrid if shared else only, discover),
                             lambda b: dataset.batch(b, spec.rollout.prompts_per_iteration),
                             options, group_size=spec.algorithm.group_size,
                             max_staleness=spec.algorithm.max_staleness, first_batch=first, version=version,
                             generate=trajectory_groups(spec.algorithm.group_size) if multi_turn else None,
                             seed=spec.seed)
    return AsyncSource(spec, dataset, producer.start(), producing, shared=shared), rollouts


def routed(m: Pending, completion: list[int]) -> torch.Tensor | None:
    """A completion's routed experts as the trainer replays them (`Sample.routed_experts`), None without routing
    replay. An empty completion, stood in for by EOS, lacks the routing of its last prompt token (vLLM records
    the tokens before the last one it runs): that row routes to experts 0..topk-1, as the packer's filler does."""
    if m.routed_experts is None:
        return None
    rows = torch.from_numpy(m.routed_experts.array().copy())
    missing = len(m.prompt_ids) + len(completion) - 1 - rows.shape[0]
    if missing > 0:
        filler = torch.arange(rows.shape[2], dtype=rows.dtype).expand(missing, rows.shape[1], rows.shape[2])
        rows = torch.cat([rows, filler])
    return rows


def to_samples(groups: Sequence[Group], eos_id: int, decode: Callable[[list[int]], str],
               pixels: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
               ) -> tuple[list[Sample], list[RewardInput]]:
    """The algorithm's samples (behaviour log-probs per token) and what the rewards judge; the text
    of a completion generated in several segments is decoded from all of its tokens. `pixels`: a prompt's
    pictures as the model's pixel values (vision-language models), once per group."""
    samples: list[Sample] = []
    inputs: list[RewardInput] = []
    for g, group in enumerate(groups):
        images = pixels(group.prompt.images) if pixels is not None and group.prompt.images else ()
        for m in group.members:
            env_images = pixels(m.pictures) if pixels is not None and m.pictures else ()
            ids = m.token_ids or [eos_id]
            ok = len(m.logprobs) == len(ids) and not any(math.isnan(x) for x in m.logprobs)
            samples.append(Sample(prompt_ids=m.prompt_ids, completion_ids=list(ids), group=g,
                                  rollout_logprobs=list(m.logprobs) if ok else None,
                                  truncated=m.finish_reason == "length" if m.finish_reason else None,
                                  completion_mask=list(m.mask) if m.mask is not None and m.token_ids else None,
                                  routed_experts=routed(m, ids), images=images, completion_images=env_images))
            text = m.text if len(m.segments) <= 1 else decode(m.token_ids)
            inputs.append(RewardInput(group.prompt.question, text, group.prompt.answer, m.env_reward))
    if any(s.rollout_logprobs is None for s in samples):  # e.g. an empty completion stood in for by EOS
        for s in samples:
            s.rollout_logprobs = None
    return samples, inputs
