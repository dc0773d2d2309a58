"""TMA helpers for the Hopper kernel: per-CTA descriptor workspace and explicit-coordinate loads.

Descriptors live in a global workspace, one slot of `sets` sets x 4 maps per CTA. The producer
warp copies the templates (kernel parameters) into every set once, and on every group change
patches the next set in turn with the group's address, dims and strides (with Config.patch_ahead
one tile before the group's first load, which takes one set more). `sets_needed` makes the
rotation long enough that a set is rewritten only after every load issued from it has
completed, however few stages a group's tiles have.

Loads are issued through the NVVM op with `elect.sync` as its predicate and every operand
computed outside any branch: ptxas otherwise sinks an R2UR into the elected block on sm_90a,
which is an illegal instruction at run time (CUDA error 715), as NVIDIA's Hopper grouped GEMM
example documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm, nvvm
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

TENSORMAP_BYTES = 128
MAPS_PER_SET = 4


def sets_needed(ring_stages: int) -> int:
    """Descriptor sets for a producer whose loads fill rings at most `ring_stages` loads deep
    (counted in weight stages; every group change is followed by at least one). A set is
    patched again only after (sets - 1) later groups' loads: at least `ring_stages` of them,
    and issuing the last one waited for the slot of the set's own last load to be consumed,
    so that load (and its descriptor read) is complete. Two sets would rely on every tile
    having at least `ring_stages` stages, which small k (e.g. 512 with 3 stages) breaks."""
    return ring_stages + 1

_manager = TensorMapManager(TensorMapUpdateMode.GMEM, TENSORMAP_BYTES)


def descriptor_ptr(workspace_i64: cute.Pointer, cta: Any, set_idx: Any, operand: int,
                   sets: int) -> Any:
    """Typed gmem pointer to descriptor `operand` of `set_idx` in this CTA's workspace slot of
    `sets` sets."""
    per_map = TENSORMAP_BYTES // 8
    slot = (cta * sets + set_idx) * MAPS_PER_SET + operand
    return _manager.get_tensormap_ptr(workspace_i64 + slot * per_map)


@dsl_user_op
def tma_load(desc: Any, smem: cute.Pointer, mbar: cute.Pointer, coords: Sequence[Any], *,
             loc: Any = None, ip: Any = None) -> None:
    """One elected lane issues cp.async.bulk.tensor (tile mode) at explicit coordinates."""
    coord_values = [Int32(c).ir_value(loc=loc, ip=ip) for c in coords]
    desc_generic = llvm.addrspacecast(llvm.PointerType.get(0), desc.llvm_ptr, loc=loc, ip=ip)
    smem_ptr = smem.llvm_ptr
    mbar_ptr = mbar.llvm_ptr
    elected = nvvm.elect_sync(loc=loc, ip=ip)
    nvvm.CpAsyncBulkTensorGlobalToSharedClusterOp(
        smem_ptr, desc_generic, coord_values, mbar_ptr, [],
        predicate=elected, mode=nvvm.TMALoadMode.TILE, loc=loc, ip=ip,
    )
