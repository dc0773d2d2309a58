"""CuTe DSL kernel sources, imported only at build time.

`kernels.families` (no DSL import) maps each target arch to its kernel family, the family's
frozen config dataclass and the legality check shared by shapes.yaml validation and the
builder. `kernels.<family>.grouped_gemm.compile_kernel` (imports cutlass) compiles one config.
"""
