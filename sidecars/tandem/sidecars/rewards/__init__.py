"""Rewards: rule-based (answer matcher, format checker, sandboxed code executor), reward models,
their weighted sum, and the runner overlapping rule-based rewards with model inference.

Callers: the driver (`RewardSet(spec.rewards)`, `overlapped(...)`), tests and benchmarks.
`RewardModelScorer` lives in `rewards.model` (imports transformers lazily).
"""

from tandem.sidecars.rewards import answer, combine, format, sandbox
from tandem.sidecars.rewards.answer import answer_match, answers_equal, extract_answer, parse_number
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
from tandem.sidecars.rewards.sandbox import (
    ExecResult,
    SandboxError,
    SandboxLimits,
    code_exec_reward,
    extract_code,
    isolation_mode,
    run_tests,
)

__all__ = [
    "ExecResult", "OverlapResult", "OverlapTimings", "RewardInput", "RewardSet", "SandboxError",
    "SandboxLimits", "Scorer", "answer", "answer_match", "answers_equal", "code_exec_reward", "combine",
    "extract_answer", "extract_code", "format", "format_match", "isolation_mode", "overlapped",
    "parse_number", "rule_function", "run_tests", "sandbox",
]
