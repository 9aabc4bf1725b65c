"""Rewards: rule-based (answer matcher, format checker, the codeExec reward run in the code sandbox,
`tandem.sidecars.sandbox`), reward models, their weighted sum, and the runner overlapping rule-based rewards
with model inference.

Callers: the driver (`RewardSet(spec.rewards)`, `overlapped(...)`), tests and benchmarks.
`RewardModelScorer` lives in `rewards.reward_model` (imports transformers lazily).
"""

from tandem.sidecars.rewards import answer, code_exec, combine, format
from tandem.sidecars.rewards.answer import answer_match, answers_equal, extract_answer, parse_number
from tandem.sidecars.rewards.code_exec import code_exec_reward, extract_code
from tandem.sidecars.rewards.combine import (
    OverlapResult,
    OverlapTimings,
    RewardInput,
    RewardSet,
    Scorer,
    overlapped,
    rule_function,
)
from tandem.sidecars.rewards.format import format_match

__all__ = [
    "OverlapResult", "OverlapTimings", "RewardInput", "RewardSet", "Scorer", "answer", "answer_match",
    "answers_equal", "code_exec", "code_exec_reward", "combine", "extract_answer", "extract_code", "format",
    "format_match", "overlapped", "parse_number", "rule_function",
]
