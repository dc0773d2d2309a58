"""The ahead-of-time artifact builder: shapes.yaml -> cubins + manifest.json (build time only).

One module per job: `spec` reads shapes.yaml, `plan` expands it into plain-data build items with
content keys, `runner` runs `worker` subprocesses (one DSL import per arch), `ptx` and `elf` check
what a compile produced, `artifacts` assembles and atomically installs the directory, `verify`
re-checks one. Nothing here imports `cutlass` except `worker`, and that only in a subprocess.
"""
