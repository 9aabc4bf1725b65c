"""How a job generates: `spec.rollout` (Rollout: vLLM's image and parallelism, sampling, what vLLM does while
the trainer trains, partial and multi-turn rollouts, memory, context length, resources).

Role: part of the job's shape, split from models.py. Callers: models.py (JobSpec), `tandem.spec.model_dir`
(the context length), the sidecars through JobSpec.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.environment import Environment
from tandem.spec.strict_model import IMAGE, Base, Rule
from tandem.spec.trainer import Resources


class Partial(Base):
    """Partial rollouts: a completion generates at most tokenBudget tokens per iteration; one cut there is
    kept (tokens, sampling log-probs, the version of each segment) and continued in the next iteration
    under the newer weights, so a long answer never stalls the batch."""

    token_budget: Annotated[int, Field(ge=1, le=131_072, description="Tokens a completion may generate per "
                                       "iteration (below rollout.maxTokens).")]
    max_age: Annotated[int, Field(ge=0, le=1000, description="A carried group whose first segment is more than "
                                  "maxAge versions older than the current weights is dropped (its tokens "
                                  "wasted).")] = 4


class Rollout(Base):
    image: Annotated[str, Field(pattern=IMAGE)] = "ghcr.io/tandem-rl/rollout:0.1.0"
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    max_tokens: Annotated[int, Field(ge=1, le=131_072)] = 1024
    temperature: Annotated[float, Field(gt=0, le=4, description="Sampling temperature; above 0, since every "
                                        "algorithm compares groupSize different completions of a prompt. The "
                                        "trainer scores the same tempered policy (logits / temperature) and the "
                                        "rollout reports its log-probs.")] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, description="Nucleus sampling. Below 1 the sampler draws from a "
                                  "truncated distribution the trainer does not model: the rollout/trainer "
                                  "mismatch metrics show the gap.")] = 1.0
    prompts_per_iteration: Annotated[int, Field(ge=1, le=100_000)] = 64
    between_rollouts: Literal["terminate", "sleep", "keep"] = Field(
        default="terminate", description="What the rollout does with vLLM while the trainer trains: terminate "
        "frees the accelerator completely; sleep uses vLLM sleep mode; keep leaves it up (CPU runs).")
    partial: Partial | None = Field(default=None, description="Partial rollouts (Kimi k1.5): long "
                                    "completions are cut at a per-iteration token budget and continued later.")
    environment: Environment | None = Field(default=None, description="Multi-turn rollouts: the model may "
                                            "call tools before it answers (tandem.sidecars.envs); absent: one "
                                            "reply per completion.")
    gpu_memory_utilization: Annotated[float | None, Field(gt=0, le=1, description="Share of each GPU's "
                                      "memory vLLM takes (weights, activations, KV cache); default 0.85. Ignored "
                                      "on CPU.")] = None
    sleep_level: Annotated[Literal["auto", 1, 2], Field(json_schema_extra={"x-kubernetes-int-or-string": True},
                           description="betweenRollouts: sleep: 1 keeps the weights in host memory, 2 drops them; "
                           "auto is 2 because every wake-up is followed by loading the next version, and 1 with "
                           "trainer.lora.sync adapter, whose versions need the base weights kept.")] = "auto"
    cuda_graphs: bool = Field(default=True, description="Capture CUDA graphs in vLLM (faster decoding, slower "
                              "start); false runs eagerly. CPU runs are always eager.")
    max_model_len: Annotated[int | None, Field(ge=2, le=1_048_576, description="vLLM's context length (prompt + "
                             "completion tokens); every dataset prompt must leave room for a generated token (the "
                             "trainer refuses a longer row at start). Default: maxTokens + 1024, at most the "
                             "model's max_position_embeddings.")] = None
    spare_engine: bool = Field(default=False, description="Keep a second vLLM engine started and idle beside the "
                               "serving one: a dead or hung engine is replaced by it at once, without vLLM's cold "
                               "start (two processes importing vLLM and torch: most of a restart's tens of "
                               "seconds), and the next spare starts while it serves. Costs a second engine's "
                               "memory (weights and KV cache). CPU rollouts with betweenRollouts keep.")
    resources: Resources = Field(default_factory=Resources)
    rules = (
        Rule("!self.spareEngine || self.betweenRollouts == 'keep'",
             "a spare engine stands by for an engine kept up: betweenRollouts keep (terminate and sleep free the "
             "engine's memory between rollouts, which a spare would hold)", ".spareEngine",
             lambda r: not r.spare_engine or r.between_rollouts == "keep"),
        Rule("!has(self.partial) || self.partial.tokenBudget < self.maxTokens",
             "must be below rollout.maxTokens (otherwise no completion is ever cut)", ".partial.tokenBudget",
             lambda r: r.partial is None or r.partial.token_budget < r.max_tokens),
    )


SPARE_RULES = (  # JobSpec's: spare engines are CPU rollouts' (a GPU holds no second engine beside the trainer)
    Rule("!self.rollout.spareEngine || self.gpusPerPod == 0",
         "a spare engine would hold a second copy of the weights and KV cache in GPU memory beside the trainer's: "
         "CPU rollouts only (gpusPerPod: 0)", ".rollout.spareEngine",
         lambda s: not s.rollout.spare_engine or s.gpus_per_pod == 0),
)
