"""The cubin directory of a start-up probe (bench/first_load.py, bench/first_code.py): one
kernel per size, built on a CPU machine with the DSL, run on the GPU machine without it.

The directory holds `<prefix>_<size>.cubin` per size and index.json mapping each size to its
cubin and kernel symbol.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path


def write_probes(out: str | Path, prefix: str, sizes: Iterable[int],
                 compile_one: Callable[[int], tuple[bytes, str]],
                 describe: Callable[[int], str]) -> None:
    """Compile one kernel per size into `out` (created if missing) and write its index;
    prints one line per kernel: its file, symbol and `describe(size)`."""
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    index = {}
    for size in sizes:
        cubin, symbol = compile_one(size)
        name = f"{prefix}_{size}.cubin"
        (dest / name).write_bytes(cubin)
        index[str(size)] = {"cubin": name, "symbol": symbol}
        print(f"{name}: {symbol}, {describe(size)}")
    (dest / "index.json").write_text(json.dumps(index, indent=1))


def read_probes(src: str | Path) -> list[tuple[int, bytes, bytes]]:
    """(size, cubin image, kernel symbol) per kernel of a probe directory, in index order."""
    root = Path(src)
    index = json.loads((root / "index.json").read_text())
    return [(int(size), (root / e["cubin"]).read_bytes(), e["symbol"].encode())
            for size, e in index.items()]
