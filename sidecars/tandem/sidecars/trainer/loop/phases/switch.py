"""The accelerator changes hands: the rollouts release it after generating, the trainer onloads to train and
offloads before the rollouts take it back.

Role: `release_rollouts` frees it as `rollout.betweenRollouts` asks (terminate or sleep vLLM; the Sync phase,
`publish.sync`, brings vLLM back); `onload` and `offload` move the policy's and the critic's state between
the accelerator and host memory, where `offloads` (`trainer.offload`, on an accelerator only).
Callers: `driver.run`, `start.start_version`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tandem.sidecars.trainer.engines import common
from tandem.spec import devices

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext


def release_rollouts(ctx: TrainerContext) -> None:
    """Free the accelerator for training as the spec asks (terminate or sleep vLLM)."""
    if ctx.rollouts is None:
        return
    mode = ctx.job.spec.rollout.between_rollouts
    if mode == "terminate":
        ctx.rollouts.terminate()
    elif mode == "sleep":
        ctx.rollouts.sleep(devices.sleep_level(ctx.job.spec))  # rollout.sleepLevel (auto: 2)


def offloads(ctx: TrainerContext) -> bool:
    """Whether the state moves around rollouts: `trainer.offload`, on an accelerator only. On a
    CPU the "host" is the memory the state already lives in: a copy would free nothing and hold
    a second copy of every parameter, gradient and Adam moment."""
    return moves_state(ctx.job.spec.trainer.offload, common.device())


def moves_state(offload: bool, device: torch.device) -> bool:
    """`trainer.offload` on a device whose memory an offload frees (an accelerator, not the host)."""
    return offload and device.type != "cpu"


def onload(ctx: TrainerContext) -> None:
    """Bring the trainer's models back to the accelerator (policy, and critic if any), unless
    the state never left (`offloads`)."""
    if not offloads(ctx):
        return
    for engine in (ctx.engine, ctx.critic):
        if engine is not None:
            engine.onload()


def offload(ctx: TrainerContext) -> None:
    """Free the accelerator for the rollouts: policy and critic state to host memory, where
    `offloads` (not with `trainer.offload: false`, and not on a CPU-only pod)."""
    if not offloads(ctx):
        return
    for engine in (ctx.engine, ctx.critic):
        if engine is not None:
            engine.offload()
