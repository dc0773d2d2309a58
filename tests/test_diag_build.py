"""bench/diag_build.py: its edits must keep matching the kernel they patch, and a diagnostic
build must come out as described (checked in its SASS)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import diag_build

SOURCES = diag_build.kernel_sources(ROOT)


@pytest.mark.parametrize("variant", sorted(diag_build.VARIANTS))
def test_every_edit_matches_the_kernel_once(variant: str) -> None:
    out = diag_build.patched(SOURCES, variant)
    assert out != SOURCES
    for name, old, new in diag_build.VARIANTS[variant]:
        assert out[name].count(old) == 0 or old in new


def test_unknown_variant_and_moved_code_are_errors() -> None:
    with pytest.raises(ValueError) as info:
        diag_build.patched(SOURCES, "fast")
    assert str(info.value) == ("variant must be one of ['bare', 'compute_only', 'empty', 'half_a', "
                               "'mma2x', 'noconv', 'nohmul', 'nolds', 'nomma', 'nostore', "
                               "'phase1_only', 'sa_nofence', 'sa_nostage', 'sa_nostore', "
                               "'sa_nowait', 'sa_storers_first', 'stage_nofence', "
                               "'stage_nostore', 'stage_only', 'sync_only', 'wait0'], but got "
                               "'fast'")
    moved = dict(SOURCES, **{"weights.py": SOURCES["weights.py"].replace(
        "d_lo = dequant_word_w(lo, both, 0)", "d_lo = dequant_word_w(lo, both, 0) ")})
    with pytest.raises(ValueError, match=r"^noconv edit 0 matches 0 places in "
                                         r"kernels/sm90/weights.py, expected 1 \(the kernel "
                                         r"changed: update bench/diag_build.py\)"):
        diag_build.patched(moved, "noconv")


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs nvidia-cutlass-dsl")
def test_compute_only_build_has_no_tma_and_no_consumer_waits(tmp_path: Path) -> None:
    from kernels.introspect import nvdisasm_path

    spec = tmp_path / "spec.yaml"
    spec.write_text("schema_version: 1\ndefaults:\n  archs: [sm_90a]\n  acc_stages: {sm_90a: [1]}\n  out_dtypes: [float16]\n"
                    "sets:\n  - name: one\n    groups: [[128, 256, 256]]\n")
    out = tmp_path / "art"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "diag_build.py"), "compute_only",
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
