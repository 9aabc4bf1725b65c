"""spec.algorithm.rolloutCorrection and spec.algorithm.mismatchGuard: how the trainer corrects for, and
watches, the gap between the rollout engine's distribution and its own.

Role: the typed blocks and their own rules (CEL + Python, `Base.rules`), and the effective values the
trainer runs. `RolloutCorrection` weighs each token's policy loss by the importance ratio
rho_t = p_trainer(y_t) / p_rollout(y_t) of the model's tokens, at token level (rho_t) or sequence level
(the product or the geometric mean of the sequence's rho_t, on each of its tokens), truncated from above
(TIS), or masked outside a band [low, high] (MIS; IcePop's two-sided token masking). `tisCap`/`tisMode`
stay its token-level shorthand (`Algorithm.correction` folds them in). `MismatchGuard` watches a measure of
the gap per iteration and warns, pauses or fails the job after `iterations` consecutive iterations over a
threshold. Callers: `tandem.spec.algorithm` (the fields, the rules across them), `tandem.spec.models`
(re-exported there, where `tandem.spec.crd` finds the rules), the trainer (`algorithms.rollout_correction`,
`trainer.loop.phases.mismatch_guard`). Named, like every spec module, for the part of the spec it mirrors;
`tandem.sidecars.algorithms.rollout_correction` is the correction this field configures.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.strict_model import Base, Rule

Level = Literal["token", "sequence"]
Mode = Literal["truncate", "mask", "icepop"]
Aggregate = Literal["product", "geometric"]
ICEPOP_BAND = (0.5, 5.0)  # IcePop's [alpha, beta] (Ling Team 2025)
DEFAULT_HIGH = 2.0  # TIS's cap C (Yao et al. 2025)


class RolloutCorrection(Base):
    """Importance weights of the rollout's samples against the trainer's log-probs (grpo, ppo)."""

    level: Level = Field(default="token", description=(
        "token: each token's own ratio rho_t = p_trainer / p_rollout; sequence: one ratio per completion from "
        "its model tokens' ratios (aggregate), on every token of it."))
    aggregate: Aggregate | None = Field(default=None, description=(
        "level sequence: product (rho = prod rho_t, the sequence's exact likelihood ratio; the default) or "
        "geometric (rho = exp(mean log rho_t): the per-token ratio a sequence averages, length-independent)."))
    mode: Mode = Field(default="truncate", description=(
        "truncate (TIS): weight min(rho, high); mask (MIS): weight rho inside [low, high], 0 outside (the token, "
        "or at level sequence the whole sequence, leaves the loss; low unset: no lower bound); icepop: IcePop's "
        "two-sided token mask, mask at level token with the band [0.5, 5] unless low/high say otherwise."))
    low: Annotated[float | None, Field(ge=0, lt=1, description=(
        "mask, icepop: the band's lower end (a ratio below it is masked). Unset: mask 0 (no lower bound), "
        "icepop 0.5."))] = None
    high: Annotated[float | None, Field(ge=1, le=1_000_000, description=(
        "The cap (truncate) or the band's upper end (mask, icepop). Unset: 2 (truncate, mask), 5 (icepop)."))] = None
    rules = (
        Rule("self.mode != 'truncate' || !has(self.low)", "applies to modes mask and icepop (truncate only caps "
             "from above)", ".low", lambda c: c.mode != "truncate" or c.low is None),
        Rule("self.mode != 'icepop' || self.level == 'token'", "icepop masks tokens: level token (whole sequences "
             "outside a band: mode mask at level sequence)", ".level",
             lambda c: c.mode != "icepop" or c.level == "token"),
        Rule("!has(self.aggregate) || self.level == 'sequence'", "applies to level sequence (a token's ratio is "
             "its own)", ".aggregate", lambda c: c.aggregate is None or c.level == "sequence"),
    )

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) as the trainer applies them, the mode's defaults filled in."""
        if self.mode == "icepop":
            low, high = ICEPOP_BAND
            return (low if self.low is None else self.low, high if self.high is None else self.high)
        return (self.low or 0.0, DEFAULT_HIGH if self.high is None else self.high)

    @property
    def aggregate_value(self) -> Aggregate:
        return self.aggregate or "product"

    def summary(self) -> str:
        low, high = self.bounds
        level = "token" if self.level == "token" else f"sequence {self.aggregate_value}"
        if self.mode == "truncate":
            return f"rollout correction {level} truncate at {high:g}"
        return f"rollout correction {level} {self.mode} outside [{low:g}, {high:g}]"


class MismatchGuard(Base):
    """Watches the rollout/trainer gap of each iteration (measured on the model's tokens, before the update)."""

    metric: Literal["kl", "mismatch"] = Field(default="kl", description=(
        "kl: mismatch_kl, the mean over the model's tokens of k3(rho) = rho - 1 - log rho (an estimate of "
        "KL(rollout || trainer) per token); mismatch: mismatch_mean, the mean |log p_trainer - log p_rollout|."))
    threshold: Annotated[float, Field(gt=0, le=100, description=(
        "An iteration whose metric exceeds it counts (fp32 dense models measure ~1e-5, MoE models 1e-3 to 1e-1)."))]
    iterations: Annotated[int, Field(ge=1, le=10_000, description=(
        "Consecutive iterations over the threshold before the action (one under it starts the count again)."))] = 3
    action: Literal["warn", "pause", "fail"] = Field(default="warn", description=(
        "warn: a log line, the trainer's metrics and the job's condition MismatchGuard (an Event), training goes "
        "on; pause: the loop stops before publishing that update and waits, holding its pods, with the reason in "
        "the job's status (spec.suspend frees the pods; the next gang resumes from the newest durable copy); "
        "fail: the job fails with the reason."))

    @property
    def key(self) -> str:
        """The metrics row's key the guard reads."""
        return "mismatch_kl" if self.metric == "kl" else "mismatch_mean"

    def summary(self) -> str:
        return f"mismatch guard {self.key} > {self.threshold:g} x{self.iterations}: {self.action}"
