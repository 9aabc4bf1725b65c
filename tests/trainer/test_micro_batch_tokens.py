"""`trainer.microBatchTokens`: rows per micro-batch from a token cap (`micro_batches.rows_per_micro_batch`)."""

from __future__ import annotations

import pytest

from tandem.sidecars.trainer.engines.micro_batches import rows_per_micro_batch


@pytest.mark.parametrize(("rows", "row_len", "size", "cap", "equal", "want"), [
    (8, 256, 8, None, False, 8),  # no cap: microBatchSize rows
    (8, 256, 8, 512, False, 2),  # 512 tokens: two 256-token rows
    (8, 256, 8, 100, False, 1),  # never fewer than one row, however long
    (8, 64, 4, 4096, False, 4),  # a cap that does not bind leaves microBatchSize
    (9, 256, 8, 1024, True, 3),  # pipeline parallelism: the largest count within the cap dividing the rows
    (7, 256, 8, 1024, True, 1),  # a prime number of rows: one row at a time
    (9, 64, 4, 4096, True, 4),  # cap not binding: unchanged (the engine refuses 9 % 4 as before)
])
def test_rows_per_micro_batch(rows: int, row_len: int, size: int, cap: int | None, equal: bool, want: int) -> None:
    assert rows_per_micro_batch(rows, row_len, size, cap, equal=equal) == want
