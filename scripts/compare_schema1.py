"""Behaviour-preservation check for manifest schema 2 (issue 25): every kernel name of a schema-1
artifact directory is served under schema 2 by a cubin with the same sha256 and the same
recorded launch data (symbol, block, cluster, smem, params, tables, tile, grid, served shapes,
limits, options).

    python scripts/compare_schema1.py OLD_SCHEMA1_DIR NEW_SCHEMA2_DIR

Reads both manifests as JSON (the runtime refuses schema 1 on purpose). Exit 1 on any
difference, listing each.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare(old_dir: Path, new_dir: Path) -> list[str]:
    old = json.loads((old_dir / "manifest.json").read_text())
    new = json.loads((new_dir / "manifest.json").read_text())
    if old.get("schema_version") != 1 or new.get("schema_version") != 2:
        return [f"want schema 1 then 2, got {old.get('schema_version')} and "
                f"{new.get('schema_version')}"]
    kernels = {k["key"]: k for k in new["kernels"]}
    sets = {s["name"]: s for s in new["sets"]}
    problems = []
    if sorted(sets) != sorted(e["name"] for e in old["kernels"]):
        problems.append("the two manifests serve different names")
    for e in old["kernels"]:
        s = sets.get(e["name"])
        if s is None:
            continue
        k = kernels[s["kernel"]]
        c = dict(e["constraints"])
        served = {key: c.pop(key) for key in ("groups", "dynamic_m") if key in c}
        pairs = [("cubin sha256 (file)", _sha(old_dir / e["cubin"]), _sha(new_dir / k["cubin"])),
                 ("sha256", e["sha256"], k["sha256"]), ("serves", served, s["serves"]),
                 ("limits", c, k["limits"])]
        pairs += [(f, e[f], k[f]) for f in ("symbol", "block", "cluster", "dynamic_smem",
                                             "sm_count", "params", "tables", "tile", "grid",
                                             "options", "arch", "acc_stages", "out_dtype",
                                             "family", "cubin_bytes")]
        pairs += [(f, e[f], s[f]) for f in ("set", "arch", "acc_stages", "out_dtype")]
        problems += [f"{e['name']}: {f} differs: {a!r} vs {b!r}" for f, a, b in pairs if a != b]
    return problems


def main() -> int:
    old_dir, new_dir = (Path(a) for a in sys.argv[1:3])
    problems = compare(old_dir, new_dir)
    new = json.loads((new_dir / "manifest.json").read_text())
    n_old = len(json.loads((old_dir / "manifest.json").read_text())["kernels"])
    print(f"{old_dir}: {n_old} schema-1 entries (one cubin each); {new_dir}: "
          f"{len(new['sets'])} set entries served by {len(new['kernels'])} distinct kernels")
    for p in problems:
        print(f"  {p}")
    print("identical: every name is served by the same cubin bytes and launch data"
          if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
