"""CuTe DSL kernel sources, imported only at build time.

`kernels.families` (no DSL import) maps each target arch to its kernel family, the family's
frozen config dataclass and the legality check shared by shapes.yaml validation and the
builder. The family's compile module (`kernels.sm90.compile`, `kernels.sm100.grouped_gemm`;
imports cutlass) has `compile_kernel`, which compiles one config.
"""
