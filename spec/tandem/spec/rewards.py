"""`spec.rewards`: what scores a completion: rules on the final answer, a reward model, the environment's reward.

Role: the typed shape of one entry and its rules (CEL + Python): a format reward's pattern must compile as RE2,
as the API server checks it (`tandem.spec.pattern`). Callers: `tandem.spec.models` (`JobSpec.rewards`), the
sidecars' rewards (`tandem.sidecars.rewards.combine.RewardSet`), the evaluator and the trainer's preflight.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from tandem.spec.pattern import CEL_RULE as PATTERN_RULE
from tandem.spec.pattern import MESSAGE as PATTERN_MESSAGE
from tandem.spec.pattern import compile_re2
from tandem.spec.strict_model import Base, Rule

# The API server refuses a pattern that RE2 cannot compile, naming the field, as `tandem validate` does. The
# bound on its length keeps the rule's estimated cost (the pattern's length) within the API server's budget:
# unbounded, the CRD itself is refused (estimated rule cost exceeds budget).
PATTERN_CEL: JsonDict = {"x-kubernetes-validations": [{"rule": PATTERN_RULE, "message": PATTERN_MESSAGE}]}
PATTERN_MAX = 4096


class Reward(Base):
    type: Literal["answerMatch", "format", "codeExec", "model", "environment"] = Field(description=(
        "answerMatch, format, codeExec: rules on the final answer; model: a reward model; environment: the "
        "reward that rollout.environment (custom or agent) gave the trajectory, 0 where it gave none."))
    weight: Annotated[float, Field(ge=-1000, le=1000)] = 1.0
    pattern: Annotated[str | None, Field(
        min_length=1, max_length=PATTERN_MAX, json_schema_extra=PATTERN_CEL, description=(
            "Regular expression (RE2 syntax: no backreferences or look-around) the whole completion must match "
            "(format); . also matches a newline."))] = None
    timeout_seconds: Annotated[float, Field(gt=0, le=600, description="Time limit (codeExec) of a sample's "
                                            "program and tests; with I/O cases, of each case.")] = 5.0
    path: Annotated[str | None, Field(min_length=1, description="Reward-model directory (model).")] = None
    match: Annotated[Literal["strict", "flexible"], Field(description=(
        "answerMatch: strict compares the completion's final answer (<answer>, \\boxed{}, 'Answer:' line, "
        "else the whole completion) with the reference; flexible also accepts the last number in that answer "
        "(numeric reference) or the reference as a whole word or phrase in it (text reference), and looks in "
        "the whole completion when it has no such marker."))] = "strict"
    rules = (
        Rule("self.type != 'format' || has(self.pattern)", "format reward needs a pattern", ".pattern",
             lambda r: r.type != "format" or r.pattern is not None),
        Rule("self.type != 'model' || has(self.path)", "model reward needs a path", ".path",
             lambda r: r.type != "model" or r.path is not None),
        Rule("!has(self.match) || self.match == 'strict' || self.type == 'answerMatch'",
             "match applies only to answerMatch rewards", ".match",
             lambda r: r.match == "strict" or r.type == "answerMatch"),
    )

    @model_validator(mode="after")
    def _pattern_compiles(self) -> Reward:  # the CRD's check: PATTERN_CEL (tandem.spec.pattern)
        if self.pattern is not None:
            try:
                compile_re2(self.pattern)
            except ValueError as e:
                raise ValueError(f"pattern: {PATTERN_MESSAGE}: {e}") from None
        return self
