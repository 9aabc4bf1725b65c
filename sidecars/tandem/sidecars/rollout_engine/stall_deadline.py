"""How long a call into vLLM may go without progress before it counts as hung: a deadline at the job's pace.

Role: a pure policy over the durations `StepWatch` (step_watch.py) observed for one kind of call ("step", the
steps of vLLM's engine loop; "reload", a version loaded in place; "add adapter"). `deadline(what, durations,
ceiling_s)` is MULTIPLE x the P-th percentile of the last WINDOW calls of that kind, at least FLOOR_S, at most
`ceiling_s` (failurePolicy.rolloutStallSeconds, the user's cap). Until WARM calls of a kind have returned the
deadline is the ceiling, so a first long prefill, a first large reload or a first step after a restart never
false-alarms. Callers: `StepWatch.open_call` and `StepWatch.deadline` (which /health and the rollout's status
report as `stallDeadlineS`), the rollout's supervisor (kills at it) and, through /health, the driver's
`rollout_health.Watch` (drops at it, under its own ceiling).

Why these numbers:
- one step of vLLM does at most max_num_batched_tokens tokens of work: vLLM chunks every prefill to that budget,
  so a step's time is bounded by its longest chunk, whatever the prompt's length. The first steps of every
  generate are its prefills, and they are observed like any step, so the window's tail holds them;
- P = 0.99 over WINDOW = 512 calls: for steps, a few generates' worth (the job's current phase; an old
  phase ages out), whose top 1% are those prefill chunks and the scheduler's hiccups; for reloads, the job's
  history (one per iteration). The percentile, not the maximum, so one odd call does not set the pace;
- MULTIPLE = 20: above p99, a heavy tail still has rarer calls. For durations lognormal with a spread of
  sigma = 1.5 (a step 4.5x its median one time in six), the 1-in-100,000 call is 18x the p99, so 20x leaves a
  healthy engine a false alarm well under once in 100,000 calls; a hung engine is cut after 20 p99 calls' time;
- FLOOR_S = 5: a prefill chunk after a long run of short decode steps. With a window full of decode steps
  (milliseconds) and its prefills aged out, 20x p99 can be well under a chunk's time; the floor assumes that
  one chunk of max_num_batched_tokens (8192 tokens: ~0.1-0.4 s on one H100-class GPU for a 7B model,
  about as long on 8 for a 70B one) takes under 5 s, and that a GC pause or a kernel's first launch does too;
- WARM = 16 steps (hundreds follow each second), 3 of any other kind (reloads come once per iteration). After
  each engine start its first WARM calls of a kind are judged against the ceiling and not recorded: they pay
  one-time costs (kernels built for new shapes, memory first touched; on a loaded CPU machine seconds each) that
  would set the pace of the next WINDOW calls. The pace is then known after WARM more (recorded) calls, and a
  restarted engine keeps the pace its predecessor set once its own first calls returned.
On CPU the supervisor also counts the engine's processes computing as progress (step_watch.py), so a step slowed
by a loaded machine is not judged by this deadline at all; there the deadline cuts only an engine that neither
returns nor computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 512  # the most recent calls of a kind the deadline is derived from
PERCENTILE = 0.99
MULTIPLE = 20.0
FLOOR_S = 5.0
WARM = {"step": 16}  # calls of a kind that must have returned before the deadline follows them
WARM_OTHER = 3
CAP = "failurePolicy.rolloutStallSeconds"


@dataclass(frozen=True)
class Deadline:
    seconds: float
    why: str  # how it was derived, for messages: "20x the p99 step of 0.30s", "the floor of 5s (...)"
    capped: bool = False  # the ceiling itself (not warm yet, or the pace is slower than it)

    def describe(self, ceiling_s: float) -> str:
        """How it was derived, with the cap: '20x the p99 step of 0.30s; failurePolicy.rolloutStallSeconds 120
        caps it' (messages put the seconds before it: 'deadline 6s: ...')."""
        return self.why if self.capped else f"{self.why}; {CAP} {ceiling_s:.0f} caps it"


def percentile(durations: Sequence[float], q: float = PERCENTILE) -> float:
    """The q-th percentile of `durations` (nearest rank: a duration that was observed)."""
    ordered = sorted(durations)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n q), at least the first
    return ordered[int(rank) - 1]


def warm_calls(what: str) -> int:
    return WARM.get(what, WARM_OTHER)


def deadline(what: str, durations: Sequence[float], ceiling_s: float, warm: bool = True) -> Deadline:
    """The deadline of an open call of kind `what`, from the durations of that kind seen so far (the last
    WINDOW used; oldest first). `warm`: the engine is past its first calls of that kind since it started
    (StepWatch); until then, and until WARM durations were recorded, the ceiling."""
    seen = list(durations)[-WINDOW:]
    if not warm or len(seen) < warm_calls(what):
        return Deadline(ceiling_s, f"{CAP} {ceiling_s:.0f} (until {warm_calls(what)} calls of {what} after the "
                                   f"engine's first {warm_calls(what)} have returned)", capped=True)
    p = percentile(seen)
    paced = MULTIPLE * p
    basis = f"{MULTIPLE:.0f}x the p{PERCENTILE * 100:.0f} {what} of {p:.2f}s"
    if max(paced, FLOOR_S) >= ceiling_s:
        return Deadline(ceiling_s, f"{CAP} {ceiling_s:.0f} ({basis} is {paced:.1f}s, the floor {FLOOR_S:.0f}s)",
                        capped=True)
    if paced < FLOOR_S:
        return Deadline(FLOOR_S, f"the floor of {FLOOR_S:.0f}s ({basis} is {paced:.2f}s)")
    return Deadline(paced, basis)
