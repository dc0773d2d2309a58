"""experiments/diag_build.py and experiments/diag_kernels.py: every variant overrides roles the shipped
kernel still has, and a diagnostic build comes out as described (checked in its SASS)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import diag_build

NEEDS_DSL = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="needs nvidia-cutlass-dsl")


def test_unknown_variant_is_an_error() -> None:
    with pytest.raises(ValueError) as info:
        diag_build.build_env("fast")
    assert str(info.value) == ("variant must be one of ['bare', 'compute_only', 'empty', 'half_a', "
                               "'mma2x', 'noconv', 'nohmul', 'nolds', 'nomma', 'nostore', "
                               "'phase1_only', 'sa_nofence', 'sa_nostage', 'sa_nostore', "
                               "'sa_nowait', 'sa_storers_first', 'stage_nofence', "
                               "'stage_nostore', 'stage_only', 'sync_only', 'wait0'], but got "
                               "'fast'")


def test_the_build_runs_the_variant_through_the_families_hook() -> None:
    env = diag_build.build_env("noconv")
    assert env["NVFP4_BUILD_FAMILIES"] == "diag_families"
    assert env[diag_build.ENV_VARIANT] == "noconv"
    assert env["PYTHONPATH"].split(":")[:2] == [str(ROOT / "experiments"), str(ROOT)]


@NEEDS_DSL
def test_every_variant_overrides_roles_the_shipped_kernel_has() -> None:
    import diag_kernels

    from kernels.sm90.grouped_gemm import Sm90GroupedGemm

    assert sorted(diag_kernels.PARTS) == sorted(diag_build.VARIANTS)
    assert diag_kernels.ENV_VARIANT == diag_build.ENV_VARIANT
    for name in diag_kernels.PARTS:
        overridden = diag_kernels.overrides(name)
        assert overridden, name
        # A renamed role would leave the override unused: the variant would be the kernel.
        missing = [attr for attr in overridden if not hasattr(Sm90GroupedGemm, attr)]
        assert not missing, (name, missing)
        klass = diag_kernels.variant_class(name)
        assert issubclass(klass, Sm90GroupedGemm)
        assert all(getattr(klass, a) is not getattr(Sm90GroupedGemm, a) for a in overridden)


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs nvidia-cutlass-dsl")
def test_compute_only_build_has_no_tma_and_no_consumer_waits(tmp_path: Path) -> None:
    from kernels.introspect import nvdisasm_path

    spec = tmp_path / "spec.yaml"
    spec.write_text("schema_version: 1\ndefaults:\n  archs: [sm_90a]\n  acc_stages: {sm_90a: [1]}\n  out_dtypes: [float16]\n"
                    "sets:\n  - name: one\n    groups: [[128, 256, 256]]\n")
    out = tmp_path / "art"
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "diag_build.py"), "compute_only",
                           "--spec", str(spec), "--out", str(out), "-j", "1"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (kernel,) = json.loads((out / "manifest.json").read_text())["kernels"]
    tool = nvdisasm_path()
    if tool is None:
        pytest.skip("nvdisasm not found (pip install nvidia-cuda-nvdisasm)")
    sass = subprocess.run([tool, "-c", str(out / kernel["cubin"])], capture_output=True,
                          text=True, check=True).stdout
    assert "HGMMA.64x128x16" in sass  # the MMA is still there ...
    assert "UTMALDG" not in sass  # ... but nothing is loaded
