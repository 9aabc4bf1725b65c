"""spec.algorithm: the RL algorithm of a job, its loss and estimator choices, and the named presets.

Role: the typed `Algorithm` block (`tandem.spec.models.JobSpec.algorithm`) and its expansion:
`preset` (dapo, dr_grpo, gspo, rloo, reinforce_pp, cispo) fills every field of `PRESETS[preset]` the
user left out, then the name's own defaults fill the estimator choices (`NAME_DEFAULTS`: grpo takes
k3 KL in the loss, ppo k1 KL in the rewards and GAE). The expanded values are what the trainer runs
(`tandem.sidecars.algorithms.algorithm_choice`), what `tandem validate` prints and what the operator shows in
`status.algorithm`. The fields a preset sets carry no default in the CRD (`PRESETABLE`), so that a
field the API server would otherwise default is still the preset's to fill. The API server stores the
job unexpanded, so the CEL of each rule reads the expanded values through `tandem.spec.presets`
(`cel_set`, `cel_value`), and a refusal a preset caused names it (offline: `preset_note`; the CRD: a
messageExpression). Each rule blames the field the job wrote (clipC on kto blames clipC).
Callers: `tandem.spec.models` (JobSpec), `tandem.spec.crd` (no schema default for PRESETABLE).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import Field, ModelWrapValidatorHandler, PrivateAttr, model_validator

from tandem.spec import presets
from tandem.spec.presets import NAME_DEFAULTS as NAME_DEFAULTS  # re-exported: the tables live in spec.presets
from tandem.spec.presets import PRESET_MARK, Preset
from tandem.spec.presets import PRESETABLE as PRESETABLE
from tandem.spec.presets import PRESETS as PRESETS
from tandem.spec.rollout_correction import MismatchGuard, RolloutCorrection
from tandem.spec.strict_model import Base, Rule

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
_FILLED: ContextVar[tuple[str, ...]] = ContextVar("preset_filled", default=())  # while an Algorithm validates


class Overlong(Base):
    """DAPO's soft overlong punishment: a completion within `buffer` tokens of rollout.maxTokens gets
    a linear penalty from 0 to -penalty; one cut at the limit gets -penalty."""

    buffer: Annotated[int | None, Field(ge=1, le=1 << 20, description="Tokens before rollout.maxTokens where the "
                                        "penalty grows; unset: a fifth of rollout.maxTokens (DAPO: 4096 of "
                                        "20480).")] = None
    penalty: Annotated[float, Field(gt=0, le=100, description="The penalty at the limit.")] = 1.0


class DynamicSampling(Base):
    """DAPO's dynamic sampling: groups whose rewards all tie are dropped and more prompts generated."""

    max_rounds: Annotated[int, Field(ge=1, le=16, description="Generation rounds per iteration at most, the "
                                     "first included; short after them, the iteration trains on what it kept.")] = 3


class Distillation(Base):
    """On-policy distillation: the student's own samples scored by a teacher model, the negative reverse
    KL log pi_teacher - log pi_student per token as (part of) the advantage or the reward."""

    teacher: Annotated[str, Field(min_length=1, description=(
        "The teacher's HF model dir (a path in the job's volume, or relative to the job file for `tandem run`). "
        "It is scored by the trainer's own engine, as the reference model is, so it must share the student's "
        "architecture and tokenizer (a larger teacher of another shape is refused at start)."))]
    coef: Annotated[float, Field(gt=0, le=100, description="Weight of the negative reverse KL.")] = 1.0
    form: Literal["advantage", "reward"] = Field(default="advantage", description=(
        "advantage: coef x (log pi_teacher - log pi_student) is added to each token's advantage (dense, "
        "per-token credit); reward: its sum over the completion is added to the reward before the advantage "
        "estimator."))
    task_reward: bool = Field(default=True, description=(
        "Keep the rewards' advantage beside the distillation term (false, with form advantage: pure "
        "distillation, the rewards only reported)."))


# A field the other algorithms use, left out or at its neutral value: CEL, Python (the values expanded).
_NEUTRAL: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "policyLoss": ("!has(self.policyLoss) || self.policyLoss == 'clip'", lambda a: a.policy_loss == "clip"),
    "clipC": ("!has(self.clipC)", lambda a: a.clip_c is None),
    "overlong": ("!has(self.overlong)", lambda a: a.overlong is None),
    "maskTruncated": ("!has(self.maskTruncated) || !self.maskTruncated", lambda a: not a.mask_truncated),
    "tisCap": ("!has(self.tisCap)", lambda a: a.tis_cap is None),
    "rolloutCorrection": ("!has(self.rolloutCorrection)", lambda a: a.rollout_correction is None),
    "mismatchGuard": ("!has(self.mismatchGuard)", lambda a: a.mismatch_guard is None),
    "maxStaleness": ("self.maxStaleness == 0", lambda a: a.max_staleness == 0),
    "routingReplay": ("!has(self.routingReplay) || self.routingReplay != 'on'", lambda a: a.routing_replay != "on"),
    "oldLogprobs": ("!has(self.oldLogprobs) || self.oldLogprobs != 'rollout'", lambda a: a.old_logprobs != "rollout"),
}


def _not_for(name: str, field: str, why: str) -> Rule:
    """`field` left out (or neutral) when algorithm.name is `name`; the refusal blames the field itself."""
    cel, neutral = _NEUTRAL[field]
    return Rule(f"self.name != '{name}' || ({cel})", why, f".{field}", lambda a: a.name != name or neutral(a))


class Algorithm(Base):
    name: Literal["grpo", "ppo", "dpo", "kto"] = "grpo"
    preset: Preset | None = Field(default=None, description=(
        "A published recipe: fills every field it sets that the job leaves out (the job's own values win); "
        "status.algorithm and `tandem validate` show the result. dapo: clip 0.2, clipHigh 0.28, klCoef 0, "
        "token-mean, overlong shaping; dr_grpo: normStd false, seq-mean-token-sum-norm, klCoef 0; gspo: "
        "policyLoss gspo, clip 3e-4, clipHigh 4e-4, seq-mean-token-mean, klCoef 0; rloo: advantage rloo, KL k1 in "
        "the reward; reinforce_pp: advantage reinforce_pp, KL k1 in the reward; cispo: policyLoss cispo, clip 1 "
        "(no lower bound), clipHigh 0.28. grpo only. A field given null counts as left out (the preset fills it): "
        "to leave out what a preset sets, write its fields without the preset."))
    group_size: Annotated[int, Field(ge=2, le=1024, description="Completions sampled per prompt.")] = 8
    kl_coef: Annotated[float, Field(ge=0, le=10, json_schema_extra=PRESET_MARK, description=(
        "Weight of the KL to the reference (default 0.001; 0: no reference model is run)."))] = 0.001
    clip: Annotated[float, Field(gt=0, le=1, json_schema_extra=PRESET_MARK, description=(
        "The ratio clip epsilon: the lower bound 1 - clip, and the upper 1 + clip unless clipHigh is set "
        "(clipLow in DAPO's terms; default 0.2)."))] = 0.2
    clip_high: Annotated[float | None, Field(gt=0, le=10, json_schema_extra=PRESET_MARK, description=(
        "Upper clip epsilon (DAPO's clip-higher, 0.28); unset: clip."))] = None
    clip_c: Annotated[float | None, Field(gt=1, le=100, description=(
        "Dual-clip: a token with a negative advantage loses at most clipC x |A| (3 in the dual-clip paper)."))] = None
    policy_loss: Literal["clip", "gspo", "cispo"] = Field(default="clip", json_schema_extra=PRESET_MARK, description=(
        "clip: PPO's per-token clipped ratio; gspo: the sequence's ratio exp(mean log(pi/pi_old)) on every token, "
        "clipped; cispo: the clipped ratio as a stop-gradient weight on log pi (every token keeps a gradient)."))
    advantage: Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"] | None = Field(
        default=None, json_schema_extra=PRESET_MARK, description=(
            "grpo: group-normalised reward (normStd); rloo: leave-one-out baseline; reinforce_pp: gamma-discounted "
            "token returns whitened over the batch; reinforce_pp_baseline: the same after subtracting the group "
            "mean; gae: PPO's (ppo only). Unset: grpo for grpo, gae for ppo."))
    norm_std: bool = Field(default=True, json_schema_extra=PRESET_MARK, description=(
        "grpo advantage: divide by the group's std (false: Dr. GRPO)."))
    loss_agg: LossAgg = Field(default="token-mean", json_schema_extra=PRESET_MARK, description=(
        "token-mean: every completion token of the batch weighs the same (DAPO; the default); "
        "seq-mean-token-mean: each sequence's mean, then the mean over sequences (the original GRPO); "
        "seq-mean-token-sum: each sequence's sum, mean over sequences; seq-mean-token-sum-norm: the same "
        "divided by lossAggNorm (Dr. GRPO)."))
    loss_agg_norm: Annotated[int | None, Field(ge=1, le=1 << 20, description=(
        "seq-mean-token-sum-norm's constant divisor; unset: rollout.maxTokens."))] = None
    kl_estimator: Literal["k1", "k2", "k3"] | None = Field(default=None, json_schema_extra=PRESET_MARK, description=(
        "KL(policy || reference) per token, d = log pi - log pi_ref: k1 d, k2 d^2/2, k3 exp(-d) + d - 1 (low "
        "variance). Unset: k3 for grpo, k1 for ppo."))
    kl_penalty: Literal["loss", "reward"] | None = Field(default=None, json_schema_extra=PRESET_MARK, description=(
        "loss: klCoef x KL added to the loss per token; reward: subtracted from the rewards (the sampling "
        "policy's KL, before the advantages). Unset: loss for grpo, reward for ppo (which supports only reward)."))
    overlong: Overlong | None = Field(default=None, json_schema_extra=PRESET_MARK, description=(
        "DAPO's overlong reward shaping (grpo)."))
    mask_truncated: bool = Field(default=False, json_schema_extra=PRESET_MARK, description=(
        "Completions cut at rollout.maxTokens leave the loss (DAPO's overlong filtering; grpo)."))
    dynamic_sampling: DynamicSampling | None = Field(default=None, json_schema_extra=PRESET_MARK, description=(
        "DAPO's dynamic sampling (grpo, synchronous rollouts, rule-based rewards): each iteration keeps "
        "rollout.promptsPerIteration groups whose rewards differ, generating more prompts for up to maxRounds."))
    lr: Annotated[float, Field(gt=0, le=1)] = 1.0e-6
    iterations: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    epochs: Annotated[int, Field(ge=1, le=16, description="Optimizer passes over each iteration's samples.")] = 1
    old_logprobs: Literal["auto", "trainer", "rollout"] = Field(default="auto", description=(
        "The behaviour policy every optimizer step's ratio (clip, rollout correction) is taken against. auto: the "
        "trainer's log-probs of the sampled tokens, from one forward before the first update, whenever an "
        "iteration takes more than one optimizer step (more samples than trainer.globalBatchSize, or epochs > 1) "
        "or the algorithm needs them; with one step the ratio is 1 exactly and the forward is skipped. trainer: "
        "that forward always. rollout: the rollout engine's own log-probs stand for the old policy (no forward; "
        "the ratio then holds the rollout/trainer mismatch as well as the updates, so clipping acts on engine "
        "noise from the first step and rollout correction has nothing left to correct: refused with it; grpo, "
        "ppo)."))
    gamma: Annotated[float, Field(ge=0, le=1, description="Discount of PPO's GAE and REINFORCE++'s returns.")] = 1.0
    lam: Annotated[float, Field(ge=0, le=1, description="PPO GAE lambda.")] = 0.95
    critic: bool = Field(default=False, description="PPO with a learned critic (otherwise group baseline).")
    beta: Annotated[float, Field(gt=0, le=100, description="DPO's and KTO's temperature.")] = 0.1
    desirable_weight: Annotated[float, Field(gt=0, le=100, description=(
        "KTO's lambda_D: the weight of a desirable example's loss (raise it when desirable examples are fewer: "
        "the KTO paper keeps lambda_D n_D / (lambda_U n_U) in [1, 4/3]).")) ] = 1.0
    undesirable_weight: Annotated[float, Field(gt=0, le=100, description="KTO's lambda_U, the weight of an "
                                               "undesirable example's loss.")] = 1.0
    distillation: Distillation | None = Field(default=None, description=(
        "On-policy distillation from a teacher model (grpo): its log-probs on the student's own samples, "
        "scored in the Inference phase beside the reference's."))
    tis_cap: Annotated[float | None, Field(ge=1, le=1000, description="Truncated importance sampling: weigh "
                                           "each token's policy loss by min(p_trainer / p_rollout, tisCap), "
                                           "correcting for the rollout engine's numeric mismatch "
                                           "(GRPO, PPO); with stale samples (rollout.partial, maxStaleness) "
                                           "p_rollout is the policy version that sampled each token. The "
                                           "shorthand of rolloutCorrection {level: token, mode: tisMode, high: "
                                           "tisCap}.")] = None
    tis_mode: Literal["truncate", "mask"] = Field(
        default="truncate", description="What tisCap does to a token whose weight p_trainer / p_rollout exceeds "
        "it: truncate weighs it by tisCap; mask drops it from the loss (weight 0).")
    rollout_correction: RolloutCorrection | None = Field(default=None, description=(
        "Importance sampling against the rollout's log-probs beyond tisCap (grpo, ppo): token or sequence level "
        "(product or geometric mean of the model tokens' ratios), truncated (TIS), masked outside [low, high] "
        "(MIS) or IcePop's two-sided token mask. Metrics: mismatch_kl, mismatch_ess, is_ess and the shares of "
        "tokens and sequences clipped or masked."))
    mismatch_guard: MismatchGuard | None = Field(default=None, description=(
        "Warn, pause or fail when the rollout/trainer mismatch exceeds a threshold for some consecutive "
        "iterations (grpo, ppo)."))
    routing_replay: Literal["auto", "on", "off"] = Field(default="auto", description=(
        "Routing replay (R3) for mixture-of-experts models: the rollout engine records the experts each token was "
        "routed to in every MoE layer, the samples carry them, and the trainer's old-log-prob, reference and "
        "train forwards route each token to those experts (grpo, ppo). auto: on for a MoE model of a family both "
        "engines replay (mixtral) on trainer.engine megatron with single-turn rollouts, off otherwise; on: the "
        "same, refused where it cannot run (the hf engine, a dense model, multi-turn environments); off: each "
        "engine routes by itself."))
    max_staleness: Annotated[int, Field(ge=0, le=64, description="Asynchronous RL: rollout-only pods generate "
                                        "continuously while the trainer trains, and the trainer never consumes a "
                                        "sample more than maxStaleness weight versions old. 0 is the synchronous "
                                        "loop.")] = 0
    rules = (
        Rule("self.name == 'ppo' || !self.critic", "critic applies only to ppo", ".critic",
             lambda a: a.name == "ppo" or not a.critic),
        Rule("!has(self.tisCap) || self.name != 'dpo'", "tisCap applies to grpo and ppo", ".tisCap",
             lambda a: a.tis_cap is None or a.name != "dpo"),
        Rule("!has(self.rolloutCorrection) || !has(self.tisCap)",
             "tisCap (with tisMode) is rolloutCorrection's token-level shorthand: set one of them",
             ".rolloutCorrection",
             lambda a: a.rollout_correction is None or a.tis_cap is None),
        *(_not_for(name, f, "applies to grpo and ppo (the algorithms that train on the rollouts' samples)")
          for name in ("dpo", "kto") for f in ("rolloutCorrection", "mismatchGuard", "routingReplay", "oldLogprobs")),
        Rule("!has(self.oldLogprobs) || self.oldLogprobs != 'rollout' || (!has(self.rolloutCorrection) && "
             "!has(self.tisCap) && !has(self.mismatchGuard))",
             "with oldLogprobs rollout the rollout's log-probs are the old policy: rolloutCorrection, tisCap and "
             "mismatchGuard would compare them with themselves (use oldLogprobs auto or trainer)", ".oldLogprobs",
             lambda a: a.old_logprobs != "rollout" or (a.rollout_correction is None and a.tis_cap is None
                                                        and a.mismatch_guard is None)),
        Rule("!has(self.preset) || self.name == 'grpo'", "presets are recipes of grpo (name: grpo)", ".preset",
             lambda a: a.preset is None or a.name == "grpo"),
        Rule("!has(self.advantage) || (self.name == 'ppo') == (self.advantage == 'gae')",
             "gae is ppo's advantage, and ppo's only (grpo takes grpo, rloo, reinforce_pp, reinforce_pp_baseline)",
             ".advantage", lambda a: a.advantage is None or (a.name == "ppo") == (a.advantage == "gae")),
        Rule("!has(self.klPenalty) || self.klPenalty == 'reward' || self.name != 'ppo'",
             "ppo takes the KL as a reward penalty only", ".klPenalty",
             lambda a: a.kl_penalty != "loss" or a.name != "ppo"),
        *(_not_for("dpo", f, "applies to grpo and ppo, not dpo (which trains on preference pairs)")
          for f in ("policyLoss", "clipC", "overlong", "maskTruncated")),
        *(_not_for("ppo", f, "applies to grpo") for f in ("overlong", "maskTruncated")),
        Rule(f"!{presets.cel_set('dynamicSampling')} || (self.name == 'grpo' && self.maxStaleness == 0)",
             "dynamic sampling applies to grpo with synchronous rollouts (maxStaleness 0)", ".dynamicSampling",
             lambda a: a.dynamic_sampling is None or (a.name == "grpo" and a.max_staleness == 0),
             preset_field="dynamicSampling"),
        Rule("!has(self.distillation) || self.name == 'grpo'", "on-policy distillation applies to grpo",
             ".distillation", lambda a: a.distillation is None or a.name == "grpo"),
        Rule("self.name == 'kto' || self.desirableWeight == 1.0", "applies to kto", ".desirableWeight",
             lambda a: a.name == "kto" or a.desirable_weight == 1.0),
        Rule("self.name == 'kto' || self.undesirableWeight == 1.0", "applies to kto", ".undesirableWeight",
             lambda a: a.name == "kto" or a.undesirable_weight == 1.0),
        *(_not_for("kto", f, "does not apply to kto, which trains on a labelled dataset")
          for f in ("policyLoss", "clipC", "overlong", "maskTruncated", "tisCap", "maxStaleness")),
        Rule(f"!has(self.lossAggNorm) || {presets.cel_value('lossAgg', 'token-mean')} == 'seq-mean-token-sum-norm'",
             "applies only to lossAgg seq-mean-token-sum-norm", ".lossAggNorm",
             lambda a: a.loss_agg_norm is None or a.loss_agg == "seq-mean-token-sum-norm", preset_field="lossAgg"),
    )
    _filled: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _expand(cls, data: Any, handler: ModelWrapValidatorHandler[Algorithm]) -> Algorithm:
        """The preset's values (grpo), then the name's defaults, for every field the job leaves out."""
        if not isinstance(data, dict):
            return handler(data)
        expanded, filled = presets.expand(data)
        token = _FILLED.set(tuple(filled))
        try:
            algo = handler(expanded)
        finally:
            _FILLED.reset(token)
        algo._filled = tuple(filled)
        return algo

    def preset_note(self, rule: Rule) -> str:
        filled = _FILLED.get() or self._filled
        if rule.preset_field and presets.snake(rule.preset_field) in filled:
            return presets.note(self.preset, rule.preset_field)
        return ""

    @property
    def correction(self) -> RolloutCorrection | None:
        """The importance weights the trainer applies: rolloutCorrection, or tisCap/tisMode's token level."""
        if self.rollout_correction is not None or self.tis_cap is None:
            return self.rollout_correction
        return RolloutCorrection(level="token", mode=self.tis_mode, high=self.tis_cap)

    @property
    def clip_low_value(self) -> float:
        return self.clip

    @property
    def clip_high_value(self) -> float:
        return self.clip if self.clip_high is None else self.clip_high

    def summary(self, max_tokens: int | None = None) -> str:
        """The expanded algorithm in one line (status.algorithm, `tandem validate`); `max_tokens` is
        rollout.maxTokens (the overlong buffer's default)."""
        head = self.name + (f" (preset {self.preset})" if self.preset else "")
        if self.name in ("dpo", "kto"):
            weights = (f", desirable {self.desirable_weight:g}, undesirable {self.undesirable_weight:g}"
                       if self.name == "kto" else "")
            return f"{head}: beta {self.beta:g}{weights}"
        parts = [f"policyLoss {self.policy_loss}", f"clip {self.clip:g}/{self.clip_high_value:g}"]
        if self.clip_c is not None:
            parts.append(f"clipC {self.clip_c:g}")
        if self.name != "dpo":
            parts.append(f"advantage {self.advantage}" + ("" if self.norm_std or self.advantage != "grpo"
                                                         else " (no std)"))
            parts.append(f"lossAgg {self.loss_agg}")
            parts.append(f"klCoef {self.kl_coef:g}" + (f" {self.kl_estimator} in {self.kl_penalty}" if self.kl_coef
                                                       else ""))
        if self.overlong is not None:
            buffer = self.overlong.buffer or (max_tokens // 5 if max_tokens else "maxTokens/5")
            parts.append(f"overlong buffer {buffer} penalty {self.overlong.penalty:g}")
        if self.mask_truncated:
            parts.append("truncated masked")
        if self.dynamic_sampling is not None:
            parts.append(f"dynamic sampling {self.dynamic_sampling.max_rounds} rounds")
        if self.correction is not None:
            parts.append(self.correction.summary())
        if self.mismatch_guard is not None:
            parts.append(self.mismatch_guard.summary())
        if self.distillation is not None:
            d = self.distillation
            parts.append(f"distillation coef {d.coef:g} in {d.form}" + ("" if d.task_reward else " (no task reward)"))
        return f"{head}: " + ", ".join(parts)
