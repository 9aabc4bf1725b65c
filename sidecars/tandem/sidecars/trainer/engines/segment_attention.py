"""Attention over packed rows without a len x len matrix: one fused attention call per sample.

Role: Megatron's local `DotProductAttention` takes a dense boolean mask `[rows, 1, len, len]` and
materialises `[rows, heads, len, len]` scores, and autograd keeps the probabilities of every layer:
memory grows with the square of the row (a 16k-token row of a 9-head model: 9 GB of scores per layer).
`SegmentAttention` replaces it in the trainer's layer spec (`megatron_build.build_gpt`). Given the
compact layout `micro_batches.segment_layout(segment_ids, prefix_ids)` (an int64 `[rows, 2, len]`) instead of the
dense mask, it runs `torch.nn.functional.scaled_dot_product_attention` once per sample of each row:
causal over the sample itself, or, for a sample whose shared prompt is packed once per row, over the
prompt's tokens and then causally over its own. The fused kernels (flash on CPU and on CUDA) keep
only O(len) per head for the backward, so memory grows linearly with the row. Padding (segment 0)
attends to itself, as in the dense mask. Given a dense mask it is Megatron's attention unchanged.

Exactness: the same allowed pairs as `packing.allowed_attention`, softmax in fp32 for fp32 inputs;
tests/trainer/test_segment_attention.py compares log-probs and gradients with the dense path.
Caller: `megatron_build.build_gpt` (the layer spec's core attention); `MegatronEngine._forward_step` picks
the layout (`micro_batches.attention_input`: the compact one for rows longer than `DENSE_MAX_TOKENS`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention


def runs(ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values in a 1-d tensor."""
    values, counts = torch.unique_consecutive(ids, return_counts=True)
    out, start = [], 0
    for v, n in zip(values.tolist(), counts.tolist(), strict=True):
        out.append((int(v), start, start + int(n)))
        start += int(n)
    return out


class SegmentAttention(DotProductAttention):  # type: ignore[misc]
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
        if attention_mask is None or attention_mask.dtype == torch.bool:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("segment attention takes neither an attention bias nor packed_seq_params")
        if self.config.apply_query_key_layer_scaling or self.softmax_offset is not None:
            raise ValueError("segment attention supports neither query-key layer scaling nor a softmax offset")
        if self.training and self.attention_dropout.p > 0:
            raise ValueError("segment attention has no attention dropout (config.attention_dropout must be 0)")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        rows = [self._row(query[:, r], key[:, r], value[:, r], attention_mask[r], groups)
                for r in range(query.shape[1])]
        context = torch.stack(rows, dim=1)  # [sq, b, np, hn]
        return context.reshape(context.shape[0], context.shape[1], self.hidden_size_per_partition)

    def _row(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor,
             groups: int) -> torch.Tensor:
        """One row: q `[s, np, hn]`, k and v `[s, ng, hn]` -> `[s, np, hn]`."""
        seg, prefix = layout[0], layout[1]
        row_runs = runs(seg)
        bounds = {value: (start, end) for value, start, end in row_runs if value != 0}
        pieces = []
        for value, start, end in row_runs:
            if value == 0:  # padding sees itself only: its value, once per query head
                pieces.append(v[start:end].repeat_interleave(groups, dim=1))
                continue
            shared = int(prefix[start])
            if not bool((prefix[start:end] == shared).all()):
                raise ValueError(f"segment {value} names more than one shared prompt")
            if shared == 0:
                pieces.append(self._attend(q[start:end], k[start:end], v[start:end], groups, None))
                continue
            if shared not in bounds:
                raise ValueError(f"segment {value} names shared prompt {shared}, which is not in its row")
            p0, p1 = bounds[shared]
            own = end - start
            mask = torch.ones(own, p1 - p0 + own, dtype=torch.bool, device=q.device)
            mask[:, p1 - p0:] = torch.ones(own, own, dtype=torch.bool, device=q.device).tril()
            keys = torch.cat([k[p0:p1], k[start:end]])
            values = torch.cat([v[p0:p1], v[start:end]])
            pieces.append(self._attend(q[start:end], keys, values, groups, mask))
        return torch.cat(pieces)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Fused attention of one sample: q `[n, np, hn]`, k and v `[m, ng, hn]` -> `[n, np, hn]`;
        causal when `mask` is None (n == m), else `mask` `[n, m]` (True: allowed)."""
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                             v.transpose(0, 1).unsqueeze(0), attn_mask=mask,
                                             is_causal=mask is None, scale=self.softmax_scale)
        return out.squeeze(0).transpose(0, 1)
