"""Shape buckets (langtorch.functional.shapes): one rule for batch rows across the engine, token
search and packed embedding batches."""

import pytest

from langtorch.functional.shapes import bucket


def test_row_bucket_is_each_callers_old_rule():
    # One rule for batch rows; each caller keeps its table (references: the three rules it
    # replaced, written out).
    from langtorch.functional.shapes import ROW_BUCKETS, row_bucket

    def token_search(n):  # 8 * 2**k
        b = 8
        while b < n:
            b *= 2
        return b

    def engine(n, max_slots):  # SLOT_BUCKETS below max_slots, then max_slots
        return bucket(n, tuple(b for b in ROW_BUCKETS if b < max_slots) + (max_slots,))

    def embedding(n, per_batch):  # (1, 4, 16) up to the batch's rows
        return next((c for c in (1, 4, 16) if c >= n and c <= per_batch), per_batch)

    for n in range(0, 300):
        assert row_bucket(n, (8,)) == token_search(n), n
        for cap in (1, 3, 8, 48, 64, 256):
            assert row_bucket(max(n, 1), ROW_BUCKETS, cap=cap) == engine(max(n, 1), cap), (n, cap)
            if 1 <= n <= cap:
                assert row_bucket(n, (1, 4, 16), cap=cap) == embedding(n, cap), (n, cap)
    for bad in ({"n": -1}, {"n": 2, "buckets": ()}, {"n": 2, "cap": 0}):
        with pytest.raises(ValueError, match="row_bucket"):
            row_bucket(**bad)
