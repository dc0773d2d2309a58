"""The kernel families of a diagnostic build (experiments/diag_build.py passes this module to the
builder as NVFP4_BUILD_FAMILIES): sm_90a only, compiled by diag_kernels.compile_kernel, which
builds the variant NVFP4_DIAG_VARIANT names instead of the shipped kernel."""

from __future__ import annotations

from kernels.families import Family
from kernels.sm90 import config as sm90_config

FAMILIES = {"sm_90a": Family("sm90", sm90_config, "diag_kernels")}
