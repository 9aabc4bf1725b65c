"""Plots and summaries of a run's metrics.jsonl (one JSON object per iteration).

Caller: `tandem.cli.local` after a run (with eval.jsonl's held-out evaluations when the job has
`spec.eval`); bench scripts reuse `plot_metrics`. Rows carry
`iteration`, `reward_mean`, `kl` and `seconds` (a mapping phase -> seconds), as the trainer
driver writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def plot_metrics(rows: list[dict[str, Any]], path: Path, title: str = "",
                 evals: list[dict[str, Any]] | None = None) -> Path:
    """Reward per iteration (and held-out pass@1 after N iterations, from eval.jsonl) beside the
    phase timings; the rollout/trainer log-prob mismatch on a second axis when measured; with stale
    samples (partial or asynchronous rollouts) a third panel, `plot_staleness`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in rows]
    stale = any(r.get("staleness_max", 0) or r.get("carried_share", 0) or r.get("wasted_tokens", 0) for r in rows)
    turns = any("turns_mean" in r for r in rows)
    panels = 2 + stale + turns
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    ax1, ax2 = axes[0], axes[1]
    if stale:
        plot_staleness(rows, axes[2])
    if turns:
        plot_turns(rows, axes[-1], evals)
    ax1.plot(its, [r.get("reward_mean") for r in rows], marker="o", ms=3, label="reward mean")
    if any(r.get("reward_std") is not None for r in rows):
        lo = [r["reward_mean"] - r["reward_std"] for r in rows]
        hi = [r["reward_mean"] + r["reward_std"] for r in rows]
        ax1.fill_between(its, lo, hi, alpha=0.15)
    if evals:
        ax1.plot([e["iteration"] for e in evals], [e["pass_at_1"] for e in evals], marker="s", ms=5, color="C3",
                 label="eval pass@1 (after N iterations)")
    if any(r.get("mismatch_mean") is not None for r in rows):
        ax3 = ax1.twinx()
        ax3.plot(its, [r.get("mismatch_mean") for r in rows], color="C2", alpha=0.5, lw=1,
                 label="|logp rollout - trainer|")
        ax3.set_ylabel("log-prob mismatch", color="C2")
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("reward")
    ax1.set_title(f"{title}: reward")
    ax1.legend(fontsize=8, loc="upper left")
    ax1.grid(alpha=0.3)
    phases = sorted({p for r in rows for p in r.get("seconds", {})})
    bottom = [0.0] * len(rows)
    for p in phases:
        vals = [float(r.get("seconds", {}).get(p, 0.0)) for r in rows]
        ax2.bar(its, vals, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("seconds")
    ax2.set_title("phase timings")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_turns(rows: list[dict[str, Any]], ax: Any, evals: list[dict[str, Any]] | None) -> None:
    """Multi-turn rollouts, per iteration: model turns and tool calls per trajectory (and per held-out
    sample), the share of calls that failed, and the share of generation time spent in tools."""
    its = [r["iteration"] for r in rows]
    ax.plot(its, [r.get("turns_mean") for r in rows], marker=".", label="turns / trajectory")
    ax.plot(its, [r.get("tool_calls_mean") for r in rows], marker=".", label="tool calls / trajectory")
    if evals and any("tool_calls_mean" in e for e in evals):
        ax.plot([e["iteration"] for e in evals], [e.get("tool_calls_mean") for e in evals], "s", color="C1",
                label="tool calls / held-out sample")
    ax.plot(its, [r.get("tool_error_frac") for r in rows], marker=".", label="failed share of calls")
    ax.plot(its, [r.get("tool_share") for r in rows], lw=1, label="tool time / generation time")
    ax.set_xlabel("iteration")
    ax.set_title("turns and tools")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)


def plot_staleness(rows: list[dict[str, Any]], ax: Any) -> None:
    """Per iteration: the share of trained completions at each staleness (versions behind the weights
    they train), the share carried over from earlier iterations, and the tokens dropped as too stale."""
    its = [r["iteration"] for r in rows]
    ages = sorted({int(a) for r in rows for a in r.get("staleness_hist", {})})
    bottom = [0.0] * len(rows)
    for age in ages:
        vals = [r.get("staleness_hist", {}).get(str(age), 0) / max(r.get("completions", 0), 1) for r in rows]
        ax.bar(its, vals, bottom=bottom, label=f"{age} version{'s' if age != 1 else ''} old", alpha=0.7)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.plot(its, [r.get("carried_share", 0.0) for r in rows], color="k", marker=".", label="carried over")
    ax.set_xlabel("iteration")
    ax.set_ylabel("share of trained completions")
    ax.set_title("staleness")
    ax.legend(fontsize=8, loc="upper left")
    if any(r.get("wasted_tokens") for r in rows):
        twin = ax.twinx()
        twin.plot(its, [r.get("wasted_tokens", 0) for r in rows], color="C3", lw=1, label="tokens dropped")
        twin.set_ylabel("tokens dropped (too stale)", color="C3")


def print_summary(rows: list[dict[str, Any]], console: Console, evals: list[dict[str, Any]] | None = None) -> None:
    if not rows:
        return
    k = max(1, len(rows) // 5)
    first = sum(r["reward_mean"] for r in rows[:k]) / k
    last = sum(r["reward_mean"] for r in rows[-k:]) / k
    t = Table(title="run summary")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("iterations", str(len(rows)))
    t.add_row(f"reward mean, first {k}", f"{first:.3f}")
    t.add_row(f"reward mean, last {k}", f"{last:.3f}")
    for e in (evals[0], evals[-1]) if evals and len(evals) > 1 else evals or []:
        t.add_row(f"eval pass@1 after {e['iteration']} it. (pass@{e['k']})",
                  f"{e['pass_at_1']:.3f} ({e['pass_at_k']:.3f})")
    mismatch = [r["mismatch_mean"] for r in rows if r.get("mismatch_mean") is not None]
    if mismatch:
        worst = max(r.get("mismatch_max", 0.0) for r in rows)
        t.add_row("log-prob mismatch, mean (max)", f"{sum(mismatch) / len(mismatch):.2e} ({worst:.2e})")
    kl = [float(r["mismatch_kl"]) for r in rows if r.get("mismatch_kl") is not None]
    if kl:
        t.add_row("mismatch KL per token, mean (max)", f"{sum(kl) / len(kl):.2e} ({max(kl):.2e})")
    fired = [r for r in rows if r.get("mismatch_guard", {}).get("action") in ("warn", "pause", "fail")]
    if fired:
        t.add_row("mismatch guard fired (first)", f"{len(fired)} ({fired[0]['iteration']})")
    if any("staleness_mean" in r for r in rows):
        t.add_row("staleness, mean (max)", f"{sum(r.get('staleness_mean', 0.0) for r in rows) / len(rows):.2f} "
                  f"({max(r.get('staleness_max', 0) for r in rows)})")
        t.add_row("carried over / tokens dropped", f"{sum(r.get('carried_share', 0.0) for r in rows) / len(rows):.2f}"
                  f" / {sum(r.get('wasted_tokens', 0) for r in rows)}")
    if any("turns_mean" in r for r in rows):
        def avg(key: str) -> float:
            return sum(float(r.get(key, 0.0)) for r in rows) / len(rows)
        t.add_row("turns / tool calls per trajectory", f"{avg('turns_mean'):.2f} / {avg('tool_calls_mean'):.2f}")
        t.add_row("failed share of calls / tool time share", f"{avg('tool_error_frac'):.2f} / {avg('tool_share'):.2f}")
    phases: dict[str, float] = {}
    for r in rows:
        for p, s in r.get("seconds", {}).items():
            phases[p] = phases.get(p, 0.0) + float(s)
    total = sum(phases.values()) or 1.0
    for p, s in sorted(phases.items(), key=lambda kv: -kv[1]):
        t.add_row(f"time in {p}", f"{s:.1f}s ({100 * s / total:.0f}%)")
    console.print(t)
