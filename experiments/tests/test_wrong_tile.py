"""experiments/wrong_tile.py names the stale weight data behind a wrong column: a column built
from stage 1 whose step-3 packed words came from stage 4 (the next fill of a 3-deep ring, the
twenty-second session's race) is explained by exactly that, and an arbitrary error by nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wrong_tile import explain_column, product, values_and_scales

from runtime.nvfp4 import pack_fp4


def _operands(rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, k), dtype=torch.uint8, generator=gen)
    exps = torch.randint(-2, 3, (rows, k // 16), generator=gen)
    scales = torch.pow(2.0, exps.float()).to(torch.float8_e4m3fn).view(torch.uint8)
    return pack_fp4(codes), scales


def test_a_stale_step_is_found_and_noise_is_not() -> None:
    k = 256 * 8
    a_v, a_s = values_and_scales(*_operands(16, k, 1))
    a = a_v * a_s.repeat_interleave(16, dim=1)
    w_v, w_s = values_and_scales(*_operands(1, k, 2))
    row_v, row_s = w_v[0], w_s[0]
    stale = row_v.clone()
    stale[256 + 192:256 + 256] = row_v[4 * 256 + 192:4 * 256 + 256]  # stage 1, step 3 <- stage 4
    got = product(a, stale, row_s)
    hits = explain_column(a, {0: (row_v, row_s)}, 8, 3, got)
    assert (1, 3, "1000", "packed") in hits
    assert all(h[:2] == (1, 3) for h in hits), hits
    assert explain_column(a, {0: (row_v, row_s)}, 8, 3, got + 64.0) == []
