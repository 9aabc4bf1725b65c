"""Log-probs from hidden states a chunk at a time equal a whole log-softmax, values and gradients.

The whole computation (logits of every position, `torch.log_softmax`, autograd) is the reference;
chunks that do not divide the positions, padded vocabulary columns, bfloat16 weights, and the
vocabulary split over two real gloo ranks (tensor parallelism: max, sum and target all-reduced, input
gradients summed by the caller's copy-to-region) must all give the same numbers. The engine-level
equality (a GRPO step's loss and gradients with and without the chunked head) is in
test_megatron_engine.py (`score_only_loss_positions`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tandem.checkpoint_engine.ports import free_port
from tandem.sidecars.trainer.engines.chunked_logprobs import chunk_positions, chunked_logprobs

N, H, V, VALID = 53, 24, 40, 37  # positions, hidden, vocabulary slice(s), real vocabulary


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=gen).to(dtype)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).to(dtype)
    target = torch.randint(0, VALID, (N,), generator=gen)
    upstream = torch.randn(N, generator=gen)
    return hidden, weight, target, upstream


def _whole(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, upstream: torch.Tensor,
           valid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logits = (h @ w.t()).float()
    logits[:, valid:] = torch.finfo(torch.float32).min
    lp = torch.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
    (lp * upstream).sum().backward()
    assert h.grad is not None and w.grad is not None
    return lp.detach(), h.grad, w.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, 7, N, 4 * N])
def test_chunks_equal_the_whole_log_softmax(dtype: torch.dtype, chunk: int) -> None:
    hidden, weight, target, upstream = _inputs(dtype)
    want, want_h, want_w = _whole(hidden, weight, target, upstream, VALID)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got = chunked_logprobs(h, w, target, valid=VALID, chunk=chunk)
    (got * upstream).sum().backward()
    assert got.dtype == torch.float32 and got.shape == (N,)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (got - want).abs().max().item() < tol
    assert h.grad is not None and w.grad is not None
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    assert (h.grad.float() - want_h.float()).abs().max().item() < tol
    assert (w.grad.float() - want_w.float()).abs().max().item() < tol
    assert bool((w.grad[VALID:] == 0).all())  # padded columns never learn


def test_padded_columns_never_win() -> None:
    hidden, weight, target, _ = _inputs(torch.float32)
    weight = weight.clone()
    weight[VALID:] = hidden.abs().max() * 100  # padding whose logits would dominate if not masked
    got = chunked_logprobs(hidden, weight, target, valid=VALID, chunk=5)
    want, _, _ = _whole(hidden, weight, target, torch.zeros(N), VALID)
    assert (got - want).abs().max().item() < 1e-5


def test_chunk_size_follows_the_vocabulary() -> None:
    assert chunk_positions(49152) * 49152 <= 1 << 24
    assert chunk_positions(1 << 30) == 16  # never fewer than 16 positions


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    hidden, weight, target, upstream = _inputs(torch.float32)
    full = torch.cat([weight, torch.zeros(V, H)])  # two slices of V; the real vocabulary ends at VALID
    mine = full[rank * V:(rank + 1) * V].clone().requires_grad_()
    h = hidden.clone().requires_grad_()
    valid = max(0, min(V, VALID - rank * V))
    lp = chunked_logprobs(h, mine, target, vocab_start=rank * V, valid=valid, group=dist.group.WORLD, chunk=11)
    (lp * upstream).sum().backward()
    assert h.grad is not None and mine.grad is not None
    grad_h = h.grad.clone()
    dist.all_reduce(grad_h)  # what copy_to_tensor_model_parallel_region's backward does
    torch.save({"lp": lp.detach(), "grad_h": grad_h, "grad_w": mine.grad}, Path(out, f"{rank}.pt"))
    dist.destroy_process_group()


def test_vocabulary_split_over_two_ranks_equals_one(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    hidden, weight, target, upstream = _inputs(torch.float32)
    want, want_h, want_w = _whole(hidden, weight, target, upstream, VALID)
    ranks = [torch.load(tmp_path / f"{r}.pt") for r in (0, 1)]
    for got in ranks:
        assert (got["lp"] - want).abs().max().item() < 1e-5
        assert (got["grad_h"] - want_h).abs().max().item() < 1e-5
    assert (ranks[0]["grad_w"] - want_w).abs().max().item() < 1e-5
    assert bool((ranks[1]["grad_w"] == 0).all())  # the second slice is all padding
