"""Forward passes over a packed batch split across data-parallel ranks, gathered back per sample.

Role: the Inference phase (reference and old-policy log-probs, critic values) needs per-sample
results on every rank. Each dp rank runs the forwards on its share of the packed rows
(`micro_batches.dp_share`, the same split the train step uses), turns them into per-sample lists in the
algorithms' layout, and the lists are gathered over the dp group — so N model copies do 1/N of the
work each instead of all of it. Tensor- and pipeline-parallel ranks of one copy share a share.
Caller: `inference.inference` (every rank).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tandem.sidecars.trainer.engines import common, micro_batches
from tandem.sidecars.trainer.engines.common import Parallelism
from tandem.sidecars.trainer.engines.heads import shift_to_labels

Forward = Callable[[Any], torch.Tensor]  # packed rows -> [rows, len] in the engine's layout


def per_sample_outputs(
    forwards: Sequence[Forward | None], packed: Any, par: Parallelism
) -> list[dict[int, list[float]]]:
    """For each forward (None: skipped, gives {}), sample index → per-completion-token values."""
    lo, hi = micro_batches.dp_share(packed.num_rows, par.dp, par.dp_rank)
    local = packed.rows(lo, hi)
    mine: list[dict[int, list[float]]] = []
    for forward in forwards:
        if forward is None or hi == lo:  # a rank with no rows still joins the gather below
            if forward is not None and par.fsdp:  # ... and FSDP2's per-forward weight gathers
                forward(packed.rows(0, 1))
            mine.append({})
            continue
        out = forward(local)
        mine.append({i: v.tolist() for i, v in local.unpack(shift_to_labels(out)).items()})
    merged: list[dict[int, list[float]]] = [{} for _ in forwards]
    for part in common.dp_gather(par, mine):
        for into, got in zip(merged, part, strict=True):
            into.update(got)
    return merged
