"""Sequence packing: variable-length (prompt + completion) samples into fixed-budget rows.

Role: token sequences into the dense tensors the trainer's forward takes, and per-token values (advantages,
log-probs, values) between the packed layout and per-sample lists. Callers: the algorithms' `prepare`, the
trainer engines (forward on `input_ids`/`position_ids` within the attention boundaries), the driver (unpacking).

Alignment convention (next-token, the Megatron convention): every per-token tensor of shape
`[rows, length]` is aligned with `labels`, where `labels[r, t] = input_ids[r, t + 1]` inside the
same sequence. So the log-prob at position t is the log-prob of token t+1, computed from the logits
at position t (`token_logprobs(logits, batch.labels)`). `loss_mask[r, t] = 1` exactly when token
t+1 belongs to the same sequence and is a completion token; the prompt's tokens, the last position
of every sequence and the padding are 0. Completion token j of a sample (0-based) therefore sits at
position `start + prompt_len + j - 1` of its row.

Rows are filled first-fit-decreasing by unit length. A unit is one sequence or several that must share a row
(DPO keeps each chosen/rejected pair in one row so that splitting rows into micro-batches never splits a pair).
Rows are padded with `pad_id` to the longest row (rounded up to `pad_to_multiple`); padding has segment 0,
position 0 and no loss. Pictures (vision-language models) ride along per row (`images`, from `pictures.by_row`).

Shared prompts (`share_prompts`): the samples of a unit with one prompt (a GRPO group) hold it once.
The row gets the prompt's first n-1 tokens as a prefix segment, then each sample's own segment:
the prompt's last token and its completion, at positions n-1, n, ... Its tokens attend to the
prefix (`prefix_ids` names the prefix segment) and to their own earlier tokens, so every log-prob
equals that of the sample packed whole, while a group of g samples costs (n-1) + g(1 + c) tokens
instead of g(n + c). The prompt's last token stays in each sample: the logits there predict the
sample's first completion token. A group too long for a row is split into sub-units that fit,
each with its own copy of the prefix.

Routing replay (`routings`, MoE): each sample's routed experts `[tokens, layers, topk]` (row p: token p of
prompt + completion) become `PackedBatch.routed_experts` `[rows, length, layers, topk]`, aligned with
`input_ids`; a shared prefix takes the first sample's prompt rows. A sample's last token (never routed by
the rollout) and padding route to experts 0..topk-1: a position's routing reaches only its own hidden
state and the keys later positions of its segment read, so no scored log-prob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from tandem.sidecars.algorithms.routed import check_routings


class PackingError(ValueError):
    """A sample cannot be packed (empty prompt, or a unit longer than the token budget)."""


@dataclass(frozen=True)
class Placement:
    """Where one sequence lives in the packed batch."""

    sample: int  # index of the sample in the caller's list
    row: int
    start: int  # first position of the sequence's own tokens in its row
    prompt_len: int
    completion_len: int
    shared: int = 0  # leading prompt tokens held once for the group, in the prefix segment
    prefix_start: int = 0  # where that prefix starts in the row (when shared > 0)

    @property
    def length(self) -> int:
        """The sequence's own tokens in its row (the shared prefix not counted)."""
        return self.prompt_len - self.shared + self.completion_len

    @property
    def first(self) -> int:
        """Position (labels layout) of the log-prob of completion token 0."""
        return self.start + self.prompt_len - self.shared - 1


@dataclass
class PackedBatch:
    """Dense packed tensors plus the placements needed to go back to samples.

    `token_fields` hold per-token values aligned like `labels` (see the module docstring);
    `seq_fields` hold one value per placement (index = position in `placements`); `weights` is the
    per-token weight of the loss average (see `algorithms.functional.loss_weights`): summing the
    losses of row-wise micro-batches from `split` gives the loss of the whole batch.
    """

    input_ids: torch.Tensor  # [R, L] int64
    position_ids: torch.Tensor  # [R, L] int64, restart at 0 per sequence
    segment_ids: torch.Tensor  # [R, L] int64, 1.. per sequence within a row, 0 for padding
    labels: torch.Tensor  # [R, L] int64, next token inside the sequence, pad_id elsewhere
    loss_mask: torch.Tensor  # [R, L] float32
    seq_index: torch.Tensor  # [R, L] int64, index into placements, -1 for padding
    placements: list[Placement]
    token_fields: dict[str, torch.Tensor] = field(default_factory=dict)
    seq_fields: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: torch.Tensor | None = None  # [R, L] float32
    stats: dict[str, float] = field(default_factory=dict)  # prepare-time metrics (advantage mean…)
    prefix_ids: torch.Tensor | None = None  # [R, L] int64: the shared-prompt segment a token also sees, 0: none
    routed_experts: torch.Tensor | None = None  # [R, L, layers, topk] uint8/int16: routing replay (MoE)
    images: list[list[torch.Tensor]] | None = None  # per row, its pictures' pixel values in order (`pictures.py`)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def row_length(self) -> int:
        return int(self.input_ids.shape[1])

    def cu_seqlens(self) -> torch.Tensor:
        """Cumulative sequence boundaries of the rows flattened end to end (THD layout), int32.

        Each row's padding tail counts as one extra segment so that the lengths add up to
        rows x length; `cu_seqlens[-1] == numel(input_ids)`. A batch with shared prompts has no
        such layout (its samples are not contiguous): PackingError.
        """
        if self.prefix_ids is not None:
            raise PackingError("a batch with shared prompts has no THD layout: pack with share_prompts=False")
        bounds = [0]
        for r in range(self.num_rows):
            base = r * self.row_length
            row = sorted((p.start, p.length) for p in self.placements if p.row == r)
            for start, length in row:
                bounds.append(base + start + length)
            if bounds[-1] != base + self.row_length:
                bounds.append(base + self.row_length)
        return torch.tensor(bounds, dtype=torch.int32)

    def max_seqlen(self) -> int:
        return max((p.length for p in self.placements), default=0)

    def attention_mask(self) -> torch.Tensor:
        """Block-diagonal causal mask `[R, 1, L, L]`, True where query t may attend to key s.

        (Megatron's local attention takes the inverse: True = masked out; pass `~mask`.)
        Padding positions attend only to themselves so that no row of the softmax is empty.
        """
        return allowed_attention(self.segment_ids, self.prefix_ids)

    def scatter(self, per_sample: Sequence[Sequence[float] | torch.Tensor]) -> torch.Tensor:
        """Place per-completion-token values (indexed by sample) into a `[R, L]` float tensor."""
        out = torch.zeros(self.num_rows, self.row_length, dtype=torch.float32)
        for p in self.placements:
            values = torch.as_tensor(per_sample[p.sample], dtype=torch.float32).reshape(-1)
            if values.numel() != p.completion_len:
                raise PackingError(
                    f"sample {p.sample}: {values.numel()} values for {p.completion_len} completion tokens")
            out[p.row, p.first:p.first + p.completion_len] = values
        return out

    def unpack(self, packed: torch.Tensor) -> dict[int, torch.Tensor]:
        """Per-completion-token values of each sample (keyed by sample index) from a `[R, L]` tensor."""
        result: dict[int, torch.Tensor] = {}
        for p in self.placements:
            result[p.sample] = packed[p.row, p.first:p.first + p.completion_len]
        return result

    def unpack_tokens(self) -> dict[int, tuple[list[int], list[int]]]:
        """(prompt ids, completion ids) of each packed sample, keyed by sample index."""
        result: dict[int, tuple[list[int], list[int]]] = {}
        for p in self.placements:
            ids = self.input_ids[p.row, p.prefix_start:p.prefix_start + p.shared].tolist()
            ids += self.input_ids[p.row, p.start:p.start + p.length].tolist()
            result[p.sample] = (ids[:p.prompt_len], ids[p.prompt_len:])
        return result

    def split(self, num_micro: int) -> list[PackedBatch]:
        """Split by rows into at most `num_micro` contiguous micro-batches (weights kept global)."""
        if num_micro < 1:
            raise PackingError("num_micro must be >= 1")
        n = min(num_micro, self.num_rows)
        bounds = [round(i * self.num_rows / n) for i in range(n + 1)]
        return [self.rows(bounds[i], bounds[i + 1]) for i in range(n)]

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor on `device` (itself when already there)."""
        dev = torch.device(device)
        if self.input_ids.device == dev:
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev, non_blocking=True)

        return PackedBatch(
            move(self.input_ids), move(self.position_ids), move(self.segment_ids), move(self.labels),
            move(self.loss_mask), move(self.seq_index), list(self.placements),
            {k: move(v) for k, v in self.token_fields.items()}, {k: move(v) for k, v in self.seq_fields.items()},
            None if self.weights is None else move(self.weights), dict(self.stats),
            None if self.prefix_ids is None else move(self.prefix_ids),
            None if self.routed_experts is None else move(self.routed_experts),
            None if self.images is None else [[move(t) for t in row] for row in self.images])

    def normalised(self) -> PackedBatch:
        """This part as a batch of its own: weights rescaled to sum to 1 over its rows, DPO's pair
        count set to the pairs it holds. For a part that is its own optimizer step; parts whose
        losses are accumulated into one step stay as `split` returns them."""
        out = self.rows(0, self.num_rows)
        if out.weights is not None:
            out.weights = out.weights / out.weights.sum().clamp(min=1e-12)
        if "pair" in out.seq_fields:
            out.stats["pairs"] = float(torch.unique(out.seq_fields["pair"]).numel())
        return out

    def rows(self, lo: int, hi: int) -> PackedBatch:
        """The micro-batch of rows [lo, hi); placements and seq_fields re-indexed."""
        keep = [i for i, p in enumerate(self.placements) if lo <= p.row < hi]
        remap = torch.full((len(self.placements) + 1,), -1, dtype=torch.int64)
        remap[torch.tensor(keep, dtype=torch.int64)] = torch.arange(len(keep))
        sl = slice(lo, hi)
        seq_index = self.seq_index[sl]
        return PackedBatch(
            input_ids=self.input_ids[sl], position_ids=self.position_ids[sl],
            segment_ids=self.segment_ids[sl], labels=self.labels[sl], loss_mask=self.loss_mask[sl],
            seq_index=torch.where(seq_index >= 0, remap[seq_index.clamp(min=0)], -1),
            placements=[_shift_row(self.placements[i], lo) for i in keep],
            token_fields={k: v[sl] for k, v in self.token_fields.items()},
            seq_fields={k: v[keep] for k, v in self.seq_fields.items()},
            weights=None if self.weights is None else self.weights[sl],
            stats=dict(self.stats),
            prefix_ids=None if self.prefix_ids is None else self.prefix_ids[sl],
            routed_experts=None if self.routed_experts is None else self.routed_experts[sl],
            images=None if self.images is None else self.images[sl])


def _shift_row(p: Placement, lo: int) -> Placement:
    return replace(p, row=p.row - lo)


def allowed_attention(segment_ids: torch.Tensor, prefix_ids: torch.Tensor | None = None) -> torch.Tensor:
    """`[R, 1, L, L]`, True where query t may attend to key s: earlier tokens of its own segment, and
    of the shared-prompt segment `prefix_ids[t]` names (which precedes it in the row). Padding
    (segment 0) attends only to itself so that no row of the softmax is empty."""
    seg = segment_ids
    length = seg.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
    same = seg.unsqueeze(2) == seg.unsqueeze(1)
    if prefix_ids is not None:
        same = same | ((prefix_ids.unsqueeze(2) == seg.unsqueeze(1)) & (prefix_ids != 0).unsqueeze(2))
    pad = (seg == 0).unsqueeze(2) & torch.eye(length, dtype=torch.bool, device=seg.device).unsqueeze(0)
    allowed = (same & causal.unsqueeze(0) & (seg != 0).unsqueeze(2)) | pad
    return allowed.unsqueeze(1)


def plan_rows(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """First-fit-decreasing bin packing: indices of `lengths` grouped into rows of <= budget tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        if lengths[i] > budget:
            raise PackingError(f"unit {i} has {lengths[i]} tokens, more than the row budget {budget}")
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(budget - lengths[i])
    return rows


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    token_budget: int,
    *,
    units: Sequence[Sequence[int]] | None = None,
    pad_id: int = 0,
    pad_to_multiple: int = 1,
    share_prompts: bool = False,
    completion_masks: Sequence[Sequence[int] | None] | None = None,
    routings: Sequence[torch.Tensor | None] | None = None,
) -> PackedBatch:
    """Pack samples i = (prompts[i] + completions[i]) into rows of at most `token_budget` tokens.

    `units` (default: each sample alone) lists sample indices that must share a row, in order.
    Every sample must appear in exactly one unit. Rows keep the units' order of placement.
    With `share_prompts`, a unit of two or more samples with one prompt holds it once (module
    docstring); split into sub-units when the whole group exceeds the budget. `completion_masks[i]`
    (one 0/1 per completion token; None: all 1) keeps the 0 tokens out of the loss: a multi-turn
    completion's tool results and other environment tokens, which are context, not the model's.
    `routings[i]` (routing replay; None: no routing for any sample) is sample i's routed experts (module
    docstring); every sample must have one, covering at least all its tokens but the last.
    """
    if len(prompts) != len(completions):
        raise PackingError("prompts and completions differ in length")
    masks = list(completion_masks) if completion_masks is not None else [None] * len(prompts)
    for i, m in enumerate(masks):
        if m is not None and len(m) != len(completions[i]):
            raise PackingError(f"sample {i}: its completion mask has {len(m)} entries for {len(completions[i])} "
                               "tokens")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise PackingError(f"sample {i} has an empty prompt: nothing predicts its first token")
    routes = check_routings(routings, prompts, completions)
    unit_list = [list(u) for u in units] if units is not None else [[i] for i in range(len(prompts))]
    seen = sorted(i for u in unit_list for i in u)
    if seen != list(range(len(prompts))):
        raise PackingError("units must cover every sample exactly once")
    if share_prompts:
        unit_list = [sub for u in unit_list for sub in _shared_units(u, prompts, completions, token_budget)]
    shared = [_shares(u, prompts) for u in unit_list]
    lengths = [_unit_length(u, prompts, completions, sh) for u, sh in zip(unit_list, shared, strict=True)]
    plan = plan_rows(lengths, token_budget)
    fill = max((sum(lengths[u] for u in row) for row in plan), default=0)
    length = max(1, -(-fill // pad_to_multiple) * pad_to_multiple)
    n_rows = len(plan)
    input_ids = torch.full((n_rows, length), pad_id, dtype=torch.int64)
    labels = torch.full((n_rows, length), pad_id, dtype=torch.int64)
    position_ids = torch.zeros(n_rows, length, dtype=torch.int64)
    segment_ids = torch.zeros(n_rows, length, dtype=torch.int64)
    prefix_ids = torch.zeros(n_rows, length, dtype=torch.int64)
    seq_index = torch.full((n_rows, length), -1, dtype=torch.int64)
    loss_mask = torch.zeros(n_rows, length, dtype=torch.float32)
    routed = None if routes is None else torch.arange(routes[0].shape[2], dtype=routes[0].dtype).expand(
        n_rows, length, *routes[0].shape[1:]).clone()
    placements: list[Placement] = []

    def route(r: int, start: int, i: int, lo: int, hi: int) -> None:
        """Sample i's routing of its tokens lo..hi-1 at row r from `start` (rows it lacks keep the fill)."""
        if routed is not None and routes is not None:
            routed[r, start:start + len(routes[i][lo:hi])] = routes[i][lo:hi]

    def put(r: int, start: int, ids: list[int], first_pos: int, segment: int) -> int:
        end = start + len(ids)
        t = torch.tensor(ids, dtype=torch.int64)
        input_ids[r, start:end] = t
        labels[r, start:end - 1] = t[1:]
        position_ids[r, start:end] = torch.arange(first_pos, first_pos + len(ids))
        segment_ids[r, start:end] = segment
        return end

    for r, row in enumerate(plan):
        start = segment = 0
        for u in row:
            n_shared = shared[u]
            prefix, prefix_segment = start, 0
            if n_shared:  # the group's prompt, all but its last token, once
                segment += 1
                prefix_segment = segment
                route(r, start, unit_list[u][0], 0, n_shared)
                start = put(r, start, list(prompts[unit_list[u][0]][:n_shared]), 0, segment)
            for i in unit_list[u]:
                segment += 1
                n_p, n_c = len(prompts[i]), len(completions[i])
                own = [*prompts[i][n_shared:], *completions[i]]
                route(r, start, i, n_shared, n_p + n_c)
                end = put(r, start, own, n_shared, segment)
                prefix_ids[r, start:end] = prefix_segment
                seq_index[r, start:end] = len(placements)
                mask = masks[i]
                loss_mask[r, start + n_p - n_shared - 1:end - 1] = 1.0 if mask is None else \
                    torch.tensor(mask, dtype=torch.float32)
                placements.append(Placement(i, r, start, n_p, n_c, n_shared, prefix if n_shared else 0))
                start = end
    return PackedBatch(input_ids, position_ids, segment_ids, labels, loss_mask, seq_index, placements,
                       prefix_ids=prefix_ids if any(shared) else None, routed_experts=routed)


def _shares(unit: Sequence[int], prompts: Sequence[Sequence[int]]) -> int:
    """Prompt tokens the unit's samples hold once: n-1 when two or more share one prompt of n >= 2."""
    first = prompts[unit[0]]
    if len(unit) < 2 or len(first) < 2 or any(list(prompts[i]) != list(first) for i in unit[1:]):
        return 0
    return len(first) - 1


def _unit_length(unit: Sequence[int], prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                 shared: int) -> int:
    return shared + sum(len(prompts[i]) - shared + len(completions[i]) for i in unit)


def _shared_units(unit: Sequence[int], prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                  budget: int) -> list[list[int]]:
    """`unit` as sub-units that each fit `budget` with its prompt held once: consecutive samples are
    added while the sub-unit fits. A unit with no common prompt stays as it is."""
    if _shares(unit, prompts) == 0:
        return [list(unit)]
    out: list[list[int]] = []
    for i in unit:
        if out and _unit_length([*out[-1], i], prompts, completions, len(prompts[i]) - 1) <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def shared_row_budget(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                      groups: Sequence[Sequence[int]], cap: int) -> int:
    """The longest group with its prompt held once, up to `cap`: a row budget that lets each group
    share its prompt in one row (a longer group is split by `pack`)."""
    longest = 0
    for g in groups:
        n = _shares(g, prompts)
        longest = max(longest, _unit_length(g, prompts, completions, n) if n else 0)
    return min(longest, cap)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-prob of `labels[r, t]` under `logits[r, t]` (`[R, L, V]` -> `[R, L]`), in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
