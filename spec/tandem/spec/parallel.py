"""The trainer's parallel layout as the spec sees it: the data-parallel size and the expert-parallel rules.

Role: Megatron splits the trainer's ranks into tensor x pipeline model copies; the rest is data
parallelism, and expert parallelism splits the experts of a mixture-of-experts model over groups of
data-parallel ranks (Megatron's `initialize_model_parallel` refuses a world size that
tensorParallel x expertParallel x pipelineParallel does not divide, and its MoE layer an expert count
that expertParallel does not divide). The rules are `Rule`s like every cross-field rule: CEL for the
API server, Python for `tandem validate` and `tandem run`; the Python side also reads the model's
config.json where it is readable here (in a cluster the path often exists only in the pods).
Caller: `tandem.spec.models.JobSpec` (its `rules`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.spec.strict_model import Rule

MOE_FAMILIES = ("mixtral",)  # model.family values whose models have experts
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")  # config.json: Mixtral's, Qwen-MoE's


def data_parallel_size(replicas: int, gpus_per_pod: int, tp: int, pp: int) -> int:
    """Model copies the trainer holds: its ranks (one per GPU, or tp x pp per pod on CPU) over tp x pp."""
    ranks = replicas * gpus_per_pod if gpus_per_pod else replicas * tp * pp
    return ranks // (tp * pp)


def expert_count(path: str) -> int | None:
    """Experts per MoE layer of the model at `path` (0: a dense model), or None when config.json is unreadable."""
    if not path.startswith("/"):
        return None
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the model family rule names what is wrong with the file
    if not isinstance(config, dict):
        return None
    for key in EXPERT_COUNT_KEYS:
        if isinstance(config.get(key), int):
            return int(config[key])
    return 0


def _ep_divides_dp(s: Any) -> bool:
    t = s.trainer
    dp = data_parallel_size(int(s.replicas), int(s.gpus_per_pod), int(t.tensor_parallel), int(t.pipeline_parallel))
    return dp % int(t.expert_parallel) == 0


def _ep_fits_model(s: Any) -> bool:
    ep = s.trainer.expert_parallel
    if ep == 1:
        return True
    if s.model.family not in ("auto", *MOE_FAMILIES):
        return False
    experts = expert_count(s.model.path)
    return experts is None or (experts > 0 and experts % ep == 0)


_DP = ("(self.gpusPerPod == 0 ? self.replicas : self.replicas * self.gpusPerPod / "
       "(self.trainer.tensorParallel * self.trainer.pipelineParallel))")
_MOE = " || ".join(f"self.model.family == '{f}'" for f in ("auto", *MOE_FAMILIES))

PARALLEL_RULES = (
    Rule(f"self.trainer.expertParallel == 1 || {_DP} % self.trainer.expertParallel == 0",
         "trainer.expertParallel must divide the data-parallel size: replicas * gpusPerPod / "
         "(trainer.tensorParallel * trainer.pipelineParallel), or replicas with gpusPerPod 0",
         ".trainer.expertParallel", _ep_divides_dp),
    Rule(f"self.trainer.expertParallel == 1 || {_MOE}",
         "trainer.expertParallel > 1 needs a mixture-of-experts model (model.family mixtral, or auto with "
         "such a config.json) whose number of experts it divides", ".trainer.expertParallel", _ep_fits_model),
)
