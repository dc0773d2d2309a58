"""Write an A/B build spec from shapes.yaml: every expert set on sm_90a, with sm_90a options
set on those whose tile_m is at most --max-tile-m (the rest as shipped), so bench_models
--compare can time the variant against the shipped artifacts on every layer and tier.

    python experiments/option_ab.py --set inline_a=true --max-tile-m 32 --out /tmp/inline_ab.yaml
    python build_kernels.py build --spec /tmp/inline_ab.yaml --out .artifacts_inline

(the twenty-first session's inline_a A/B; docs/lab_notebook.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TILE_M = 128  # kernels/sm90/config.py Config.tile_m


def ab_spec(spec: dict, options: dict, max_tile_m: int) -> dict:
    """`spec`'s expert sets on sm_90a, `options` added to the sm_90a options of those whose
    tile_m is at most max_tile_m."""
    sets = []
    for entry in spec["sets"]:
        if "experts" not in entry:
            continue
        entry = dict(entry, archs=["sm_90a"])
        sm90 = dict((entry.get("options") or {}).get("sm_90a", {}))
        if sm90.get("tile_m", DEFAULT_TILE_M) <= max_tile_m:
            entry["options"] = {"sm_90a": sm90 | options}
        sets.append(entry)
    out = {key: value for key, value in spec.items() if key != "sets"}
    out["defaults"] = dict(out.get("defaults", {}), archs=["sm_90a"])
    return out | {"sets": sets}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "shapes.yaml"))
    ap.add_argument("--set", action="append", required=True, metavar="OPTION=VALUE",
                    help="an sm_90a option (VALUE read as YAML), repeatable")
    ap.add_argument("--max-tile-m", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    options = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set takes OPTION=VALUE, but got {item!r}")
        options[name] = yaml.safe_load(value)
    spec = ab_spec(yaml.safe_load(Path(args.spec).read_text()), options, args.max_tile_m)
    Path(args.out).write_text(yaml.safe_dump(spec, sort_keys=False, width=100))
    print(f"{args.out}: {len(spec['sets'])} sets, {options} on tile_m <= {args.max_tile_m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
