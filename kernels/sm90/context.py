"""The per-CTA context of the sm_90a kernel: what every role reads about the call, built once
at trace time in the kernel body and passed down as one value instead of a tail of positional
parameters. Read-only by design: CuTe DSL's AST preprocessor turns `if`/`while` on run-time
values into scf ops that carry only local variables, so an attribute written inside one fails
("A value carried through this `if` is a plain Python value"); roles rebind locals instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CtaContext:
    sizes: Any  # (num_groups, 4) Int32 tensor: m, n, k, l per group (kernels/tables.py)
    ptrs: Any  # (num_groups, 5) Int64 tensor: A, B, SFA, SFB, C addresses per group
    prefix: Any  # (num_groups + 1,) Int32 tensor: the first tile of each group, then the total
    alpha: Any  # (num_groups,) Float32 tensor: the C scale of each group
    total_tiles: Any  # Int32: prefix[num_groups]
    bidx: Any  # Int32: this CTA's index
    grid: Any  # Int32: the CTAs of the launch
