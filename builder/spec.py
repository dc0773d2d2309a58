"""shapes.yaml schema v1 -> plain frozen dataclasses, with errors that name file, set and key.

    schema_version: 1
    defaults:                       # optional; same keys as a set except name and groups
      archs: [sm_90a, sm_100a]
      acc_stages: {sm_100a: [1, 2], sm_90a: [1]}   # or a plain list for every arch
      options: {sm_90a: {tile_m: 128}}            # per-arch family options
      out_dtypes: [bfloat16, float16]              # C element types (default: both)
    sets:
      - name: moe_gateup
        groups: [[80, 4096, 7168], [176, 4096, 7168]]   # (m, n, k) per group
        archs: [...]                # optional overrides of the defaults
        acc_stages: ...
        options: ...
        out_dtypes: [bfloat16]
      - name: moe_gateup_any_m      # m chosen at run time, per call and per group
        m: dynamic
        groups: [[4096, 7168], [4096, 7168]]            # (n, k) per group
        max_m: 4096                 # optional upper bound on every group's m

A dynamic-m set builds the same shape-generic kernel; the manifest records the (n, k) list in
`constraints.dynamic_m` and the runtime serves any m >= 0 per group (m = 0 included) for calls
with exactly that (n, k) list. The kernels need no bound on m: `max_m`, when given, is recorded
and enforced by the runtime (a call with a larger m is not served by that kernel). Without it
the runtime still enforces the kernels' m * n < 2^31 per group.

Every set builds one kernel per (arch, acc stage, output dtype). `out_dtypes` lists the element
types C can be written in (`bfloat16`, `float16`; default both): the runtime picks the kernel by
the call's output dtype, and the manifest records each kernel's `out_dtype`.

A set's archs, acc_stages and out_dtypes replace the defaults; its options are merged over the
defaults' options of the same arch, key by key. An arch with no acc_stages gets its family's
default config. Every legality rule comes from the family (`kernels.<family>.config`), the same
rules the builder and the kernels use, so the file is rejected here rather than minutes into a
compile.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runtime.formats import MAX_GROUPS  # the manifest reader's bound too
from runtime.manifest import OUT_DTYPES

from .errors import SpecError
from .families import Families

SCHEMA_VERSION = 1
# A kernel is named "<set>.<arch>.acc<n>" and its cubin "<name>.<key>.cubin": no dots, no slashes.
SET_NAME_RE = re.compile(r"[A-Za-z0-9_-]+\Z")
TOP_KEYS = ("schema_version", "defaults", "sets")
DEFAULT_KEYS = ("archs", "acc_stages", "options", "out_dtypes")
SET_KEYS = ("name", "groups", "m", "max_m", "archs", "acc_stages", "options", "out_dtypes",
            "experts", "n", "k")
DEFAULT_OUT_DTYPES = ("bfloat16", "float16")
DYNAMIC = "dynamic"  # the one value of a set's `m` key
# C is indexed with 32-bit offsets in the kernels: every group needs m * n < 2^31.
MN_LIMIT = 2**31
# The problem-size device table holds int32 (m, n, k): every stored value must be < 2^31, or
# the first call would die in the runtime's planner (issue 28).
TABLE_LIMIT = 2**31
# The cubin file is "<set>.<arch>.acc<n>.<out>.<key12>.cubin" and must fit a 255-byte file
# name; 128 leaves room for every suffix (the longest is 38 bytes) and the staging prefixes.
MAX_SET_NAME = 128
# Sane caps, far above any real use (shapes.yaml: 9 KB, 18 sets, at most 40 groups): a spec
# past them is a generated mistake, and parsing and planning it would take minutes.
MAX_SPEC_BYTES = 1 << 20
MAX_SETS = 1024


@dataclass(frozen=True)
class ArchBuild:
    """What one set builds for one arch: one kernel per acc stage, all with the same options."""

    arch: str
    acc_stages: tuple[int, ...]
    options: tuple[tuple[str, Any], ...]  # (name, value) as written, sorted; defaults not filled

    def options_dict(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass(frozen=True)
class SetSpec:
    name: str
    groups: tuple[tuple[int, ...], ...]  # (m, n, k) per group; (n, k) when dynamic_m
    builds: tuple[ArchBuild, ...]  # one per arch, in the order the file lists them
    dynamic_m: bool = False  # `m: dynamic`: m is chosen per call, groups are (n, k)
    max_m: int | None = None  # optional per-group bound on m (dynamic_m sets only)
    out_dtypes: tuple[str, ...] = DEFAULT_OUT_DTYPES  # C element types, one kernel each

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(b.arch for b in self.builds)


@dataclass(frozen=True)
class ShapeSpec:
    source: str  # the file as the user named it, for messages
    sets: tuple[SetSpec, ...]

    def set_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sets)


# --------------------------------------------------------------------------------------------
# YAML
# --------------------------------------------------------------------------------------------


class _DuplicateKey(yaml.MarkedYAMLError):
    pass


class _PyLoader(yaml.SafeLoader):
    """A safe loader that rejects a key written twice in one mapping: PyYAML keeps the last one
    silently, so a second `groups:` would quietly replace the first."""


# libyaml's C parser when PyYAML has it: the pure-Python one took 72 s and 1 GB for a 5 MB
# spec (issue 28). The same duplicate-key constructor is installed on both. A file the C parser
# rejects is parsed again by the Python one, whose messages are clearer ("expected ',' or ']',
# but got '-'" where libyaml says "did not find expected ',' or ']'").
class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The fast loader, with the same duplicate-key check."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_mapping(loader: Any, node: yaml.MappingNode) -> dict[Any, Any]:
    # The keys as written, before construct_mapping flattens `<<: *anchor` merges in: a key
    # that overrides a merged one is YAML's merge, not a duplicate.
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key; construct_mapping reports it with its position
            continue
        if first is not None:
            raise _DuplicateKey(None, None, f"duplicate key {key!r} (first written on line "
                                f"{first.line + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=True)


for _cls in (_PyLoader, _Loader):
    _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# A shapes.yaml nests about 5 levels deep; libyaml's composer recurses per level and crashes the
# process (a segfault, not an exception) around 100,000.
MAX_DEPTH = 64


def _check_depth(text: str, source: str) -> None:
    """SpecError for collections nested deeper than MAX_DEPTH, found from the parser's event
    stream (iterative) before anything composes the document. Malformed YAML is left to the
    loader, whose messages say more. libyaml 0.2.6 (in PyYAML 6.0.4's wheels) stops scanning
    at 1000 levels of flow nesting, before it has given the parser the events past level 64:
    on any error of the C parser the pure-Python one (no such limit) scans again."""
    for loader in dict.fromkeys((_Loader, _PyLoader)):
        depth = 0
        try:
            for event in yaml.parse(text, Loader=loader):
                if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                    depth += 1
                    if depth > MAX_DEPTH:
                        mark = event.start_mark
                        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
                        raise SpecError(f"{source}: {where}collections nest deeper than "
                                        f"{MAX_DEPTH} levels (a shapes.yaml needs about 5)")
                elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                    depth -= 1
            return
        except yaml.YAMLError:
            continue


def read_yaml(text: str, source: str) -> Any:
    _check_depth(text, source)
    try:
        try:
            return yaml.load(text, Loader=_Loader)
        except _DuplicateKey:
            raise
        except yaml.YAMLError:
            if _Loader.__mro__[1] is yaml.SafeLoader:
                raise
            return yaml.load(text, Loader=_PyLoader)  # raises again, with clearer messages
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        what = exc.problem if isinstance(exc, _DuplicateKey) else f"malformed YAML: {exc.problem}"
        raise SpecError(f"{source}: {where}: {what}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: malformed YAML: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # e.g. an int of more than 4300 digits
        raise SpecError(f"{source}: a value cannot be read: {exc}") from exc


def load_spec(path: str | Path, families: Families) -> ShapeSpec:
    """Read and validate a shapes.yaml file."""
    source = str(path)
    try:
        size = Path(path).stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(f"{source}: the spec file must be at most {MAX_SPEC_BYTES} bytes, "
                            f"but it has {size}")
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{source}: cannot read the spec file: {exc}") from exc
    return parse_spec(read_yaml(text, source), source, families)


def parse_spec_text(text: str, source: str, families: Families) -> ShapeSpec:
    return parse_spec(read_yaml(text, source), source, families)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _got(value: Any) -> str:
    """How a YAML value reads in 'but got ...'."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value)}" if value else "an empty list"
    return f"{type(value).__name__} {value!r}"


def _an(typ: type) -> str:
    name = typ.__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _options_where(set_path: str, arch: str, own_opts: dict[str, dict[str, Any]],
                   def_opts: dict[str, dict[str, Any]]) -> str:
    """Where a set's merged options for `arch` came from, naming the keys it inherited from
    `defaults` (a rule broken by an inherited key was blamed on the set alone: issue 28)."""
    inherited = sorted(set(def_opts.get(arch, {})) - set(own_opts.get(arch, {})))
    if arch in own_opts:
        return f"{set_path}.options.{arch}" + (
            f" (with {', '.join(inherited)} from defaults.options.{arch})" if inherited else "")
    if arch in def_opts:
        return f"{set_path}.options (from defaults.options.{arch})"
    return set_path


class _Checker:
    def __init__(self, source: str, families: Families) -> None:
        self.source = source
        self.families = families
        self.def_opts: dict[str, dict[str, Any]] = {}  # defaults.options, once parsed

    def fail(self, path: str, msg: str) -> SpecError:
        return SpecError(f"{self.source}: {path}: {msg}" if path else f"{self.source}: {msg}")

    def mapping(self, value: Any, path: str, subject: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"{subject} must be a mapping, but got {_got(value)}")
        for key in value:
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                did = f"; did you mean {hint[0]!r}?" if hint else ""
                raise self.fail(path, f"unknown key {key!r}{did} (allowed keys: "
                                      f"{', '.join(allowed)})")
        for key in required:
            if key not in value:
                raise self.fail(path, f"key {key!r} is missing")
        return value

    def integer(self, value: Any, path: str, subject: str) -> int:
        # bool is an int subclass in Python and `true` is valid YAML: never take it as a number.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"{subject} must be an int, but got {_got(value)}")
        return value

    def listed(self, value: Any, path: str, subject: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, f"{subject} must be a list, but got {_got(value)}")
        if not value:
            raise self.fail(path, f"{subject} must not be empty, but got an empty list")
        return value

    def arch(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or value not in self.families.by_arch:
            raise self.fail(path, f"arch must be one of {list(self.families.archs)}, "
                                  f"but got {_got(value)}")
        return value

    # -- the keys a set shares with `defaults` ------------------------------------------------

    def archs(self, value: Any, path: str) -> tuple[str, ...]:
        out: list[str] = []
        for i, a in enumerate(self.listed(value, path, "archs")):
            arch = self.arch(a, f"{path}[{i}]")
            if arch in out:
                raise self.fail(f"{path}[{i}]", f"arch {arch!r} is listed twice")
            out.append(arch)
        return tuple(out)

    def stage_list(self, value: Any, path: str) -> tuple[int, ...]:
        out: list[int] = []
        for i, s in enumerate(self.listed(value, path, "acc_stages")):
            stage = self.integer(s, f"{path}[{i}]", "acc stage")
            if stage in out:
                raise self.fail(f"{path}[{i}]", f"acc stage {stage} is listed twice")
            out.append(stage)
        return tuple(out)

    def out_dtypes(self, value: Any, path: str) -> tuple[str, ...]:
        out: list[str] = []
        for i, v in enumerate(self.listed(value, path, "out_dtypes")):
            if not isinstance(v, str) or v not in OUT_DTYPES:
                raise self.fail(f"{path}[{i}]", f"out_dtype must be one of {list(OUT_DTYPES)}, "
                                                f"but got {_got(v)}")
            if v in out:
                raise self.fail(f"{path}[{i}]", f"out_dtype {v!r} is listed twice")
            out.append(v)
        return tuple(out)

    def acc_stages(self, value: Any, path: str) -> dict[str | None, tuple[int, ...]]:
        """A plain list (key None: every arch) or a mapping arch -> list."""
        if isinstance(value, list):
            return {None: self.stage_list(value, path)}
        if not isinstance(value, dict):
            raise self.fail(path, "acc_stages must be a list of ints or a mapping arch -> list "
                                  f"of ints, but got {_got(value)}")
        if not value:
            raise self.fail(path, "acc_stages must not be empty, but got an empty mapping")
        out: dict[str | None, tuple[int, ...]] = {}
        for arch, stages in value.items():
            out[self.arch(arch, f"{path}.{arch}")] = self.stage_list(stages, f"{path}.{arch}")
        return out

    def options(self, value: Any, path: str) -> dict[str, dict[str, Any]]:
        """A mapping arch -> {option: value}, names and value types checked against the family."""
        if not isinstance(value, dict):
            raise self.fail(path, f"options must be a mapping arch -> options, but got "
                                  f"{_got(value)}")
        out: dict[str, dict[str, Any]] = {}
        for arch, opts in value.items():
            arch = self.arch(arch, f"{path}.{arch}")
            family = self.families.family_for(arch)
            names = tuple(family.option_names())
            removed = getattr(family.config, "REMOVED_OPTIONS", {})
            for name in opts if isinstance(opts, dict) else ():
                if name in removed:
                    raise self.fail(f"{path}.{arch}.{name}",
                                    f"{name} was removed {removed[name]}; delete it")
            opts = self.mapping(opts, f"{path}.{arch}", f"options of {arch}", allowed=names)
            defaults = {f.name: f.default for f in dataclasses.fields(family.config.Config)}
            for name, v in opts.items():
                want = type(defaults[name])
                if want not in (bool, int, float, str):
                    continue  # no plain default to compare with: the family's check decides
                # YAML `2` for a float field is fine; `true` for an int field is not.
                accepted = (int, float) if want is float else want
                ok = isinstance(v, accepted) and (want is bool or not isinstance(v, bool))
                if not ok:
                    raise self.fail(f"{path}.{arch}.{name}",
                                    f"{name} must be {_an(want)}, but got {_got(v)}")
            out[arch] = dict(opts)
        return out

    # -- sets ---------------------------------------------------------------------------------

    def groups(self, value: Any, path: str, archs: tuple[str, ...],
               dynamic: bool = False) -> tuple[tuple[int, ...], ...]:
        """(m, n, k) per group, or (n, k) per group for a set with `m: dynamic`."""
        dims = ("n", "k") if dynamic else ("m", "n", "k")
        out = []
        listed = self.listed(value, path, "groups")
        if len(listed) > MAX_GROUPS:
            raise self.fail(path, f"a set must have at most {MAX_GROUPS} groups, but got "
                                  f"{len(listed)}")
        for g, group in enumerate(listed):
            gpath = f"{path}[{g}]"
            if not isinstance(group, list) or len(group) != len(dims):
                if dynamic:
                    what = "group must be a list [n, k] (the set has m: dynamic)"
                elif isinstance(group, list) and len(group) == 2:
                    what = ("group must be a list [m, n, k] (for m chosen at run time, give the "
                            "set `m: dynamic` and [n, k] groups)")
                else:
                    what = "group must be a list [m, n, k]"
                raise self.fail(gpath, f"{what}, but got {_got(group)}")
            values = [self.size(v, f"{gpath}[{i}]", dims[i]) for i, v in enumerate(group)]
            at = dict(zip(dims, range(len(dims))))
            n, k = values[at["n"]], values[at["k"]]
            self.nk_fits(n, k, archs, f"{gpath}[{at['n']}]", f"{gpath}[{at['k']}]")
            if not dynamic and values[0] * n >= MN_LIMIT:
                raise self.fail(gpath, f"m * n must be < 2^31 (the kernels index C with 32-bit "
                                       f"offsets), but got {values[0]} * {n} = {values[0] * n}")
            out.append(tuple(values))
        return tuple(out)

    def size(self, value: Any, path: str, dim: str) -> int:
        """One problem dimension: an int in 1 .. 2^31 - 1 (the device tables hold int32)."""
        v = self.integer(value, path, dim)
        if v <= 0:
            raise self.fail(path, f"{dim} must be > 0, but got {v}")
        if v >= TABLE_LIMIT:
            raise self.fail(path, f"{dim} must be < 2^31 (the runtime's problem-size table "
                                  f"holds int32), but got {v}")
        return v

    def experts(self, s: dict[str, Any], path: str,
                archs: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
        """An expert layer's (n, k) groups from `experts: E, n: N, k: K` (issue 26): E
        identical groups of one dynamic-m set, written without the list."""
        for key in ("groups", "m"):
            if key in s:
                raise self.fail(f"{path}.{key}", f"{key} must not be given with experts (an "
                                                 f"expert set is `m: dynamic` with E groups "
                                                 f"[n, k]), but got {_got(s[key])}")
        for key in ("n", "k"):
            if key not in s:
                raise self.fail(path, f"key {key!r} is missing (an expert set gives experts, n "
                                      "and k)")
        e = self.integer(s["experts"], f"{path}.experts", "experts")
        if not 1 <= e <= MAX_GROUPS:
            raise self.fail(f"{path}.experts", f"experts must be in 1..{MAX_GROUPS}, but got {e}")
        n = self.size(s["n"], f"{path}.n", "n")
        k = self.size(s["k"], f"{path}.k", "k")
        self.nk_fits(n, k, archs, f"{path}.n", f"{path}.k")
        return tuple((n, k) for _ in range(e))

    def nk_fits(self, n: int, k: int, archs: tuple[str, ...], n_path: str, k_path: str) -> None:
        """n and k against every arch's kernel family (K tile, N multiple)."""
        for arch in archs:
            cfg = self.families.family_for(arch).config
            if k % cfg.K_MULTIPLE:
                raise self.fail(k_path, f"k must be a multiple of {cfg.K_MULTIPLE} (the {arch} "
                                        f"kernel's K granule), but got {k}")
            if n % cfg.N_MULTIPLE:
                raise self.fail(n_path, f"n must be a multiple of {cfg.N_MULTIPLE} (the {arch} "
                                        f"kernel's N multiple), but got {n}")

    def dynamic_m(self, s: dict[str, Any], path: str) -> tuple[bool, int | None]:
        """(dynamic, max_m) from a set's `m` and `max_m` keys."""
        dynamic = "m" in s
        if dynamic and s["m"] != DYNAMIC:
            raise self.fail(f"{path}.m", f"m must be {DYNAMIC!r} (m chosen at run time; for "
                                         f"fixed m give [m, n, k] groups and no m key), but got "
                                         f"{_got(s['m'])}")
        if "max_m" not in s:
            return dynamic, None
        if not dynamic:
            raise self.fail(f"{path}.max_m", f"max_m is only allowed with `m: {DYNAMIC}` (this "
                                             f"set's groups fix m), but got {_got(s['max_m'])}")
        return dynamic, self.size(s["max_m"], f"{path}.max_m", "max_m")

    def max_m_fits(self, max_m: int | None, groups: tuple[tuple[int, ...], ...],
                   path: str) -> None:
        if max_m is None:
            return
        for g, (n, _) in enumerate(groups):
            if max_m * n >= MN_LIMIT:
                raise self.fail(f"{path}.max_m",
                                f"max_m * n must be < 2^31 for every group (the kernels index C "
                                f"with 32-bit offsets), but groups[{g}] has n = {n}: {max_m} * "
                                f"{n} = {max_m * n}")

    def groups_fit(self, builds: tuple[ArchBuild, ...], groups: tuple, path: str,
                   own_opts: dict[str, dict[str, Any]]) -> None:
        """Options that depend on the groups (kernels/<family>/config.py, check_groups),
        reported where the options came from, as resolve() does."""
        ks = [g[-1] for g in groups]  # (m, n, k), or (n, k) with m dynamic
        for build in builds:
            family = self.families.family_for(build.arch)
            check_groups = getattr(family.config, "check_groups", None)
            if check_groups is None:
                continue
            where = _options_where(path, build.arch, own_opts, self.def_opts)
            for s in build.acc_stages:
                reasons = check_groups(family.make_config(s, build.options_dict()), ks)
                if reasons:
                    raise self.fail(where, f"the {family.name} config for acc stage {s} cannot "
                                           f"serve this set's groups: {'; '.join(reasons)}")

    def resolve(self, set_path: str, archs: tuple[str, ...],
                acc: tuple[dict[str | None, tuple[int, ...]], bool] | None,
                own_opts: dict[str, dict[str, Any]],
                def_opts: dict[str, dict[str, Any]]) -> tuple[ArchBuild, ...]:
        """Per arch: the acc stages and merged options, checked by the family's own rules.

        A value inherited from `defaults` is reported at the set that uses it (the set fixes the
        arch list) and at the defaults key it came from."""
        builds = []
        for arch in archs:
            family = self.families.family_for(arch)
            sub = None
            if acc is not None:
                table, own = acc
                if arch in table:
                    stages, sub = table[arch], f".{arch}"
                elif None in table:
                    stages, sub = table[None], ""
            if sub is None:  # not given for this arch: the family's default config
                stages = (family.config.Config().acc_stages,)
            else:
                supported = tuple(family.config.ACC_STAGES)
                for i, s in enumerate(stages):
                    if s not in supported:
                        example = ", ".join(
                            f"{a}: {list(self.families.family_for(a).config.ACC_STAGES)}"
                            for a in archs)
                        loc = (f"{set_path}.acc_stages{sub}[{i}]" if own else
                               f"{set_path}.acc_stages (from defaults.acc_stages{sub}[{i}])")
                        raise self.fail(
                            loc,
                            f"acc stage {s} is not supported by the {arch} kernel (it supports "
                            f"{list(supported)}); give stages per arch, e.g. "
                            f"acc_stages: {{{example}}}")
            options = {**def_opts.get(arch, {}), **own_opts.get(arch, {})}
            where = _options_where(set_path, arch, own_opts, def_opts)
            for s in stages:
                reasons = family.config.check(family.make_config(s, options))
                if reasons:
                    raise self.fail(where, f"the {family.name} config for acc stage {s} is "
                                           f"invalid: {'; '.join(reasons)}")
            builds.append(ArchBuild(arch, tuple(stages), tuple(sorted(options.items()))))
        return tuple(builds)


def _serving_options(families: Families, archs: tuple[str, ...],
                     own_opts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """An expert set's options: `device_offsets: true` for each arch whose kernel family has
    that option (the serving contract's kernels, issue 26), unless the set says otherwise."""
    out = {arch: dict(opts) for arch, opts in own_opts.items()}
    for arch in archs:
        fields = getattr(families.family_for(arch).config.Config, "__dataclass_fields__", {})
        if "device_offsets" in fields:
            out.setdefault(arch, {}).setdefault("device_offsets", True)
    return out


def parse_spec(data: Any, source: str, families: Families) -> ShapeSpec:
    """Validate a decoded shapes.yaml; raise SpecError at the first problem."""
    c = _Checker(source, families)
    if data is None:
        raise c.fail("", "the file must be a mapping with schema_version and sets, "
                         "but it is empty")
    top = c.mapping(data, "", "the file", TOP_KEYS)
    if "schema_version" not in top:
        raise c.fail("", f"key 'schema_version' is missing (start the file with "
                         f"`schema_version: {SCHEMA_VERSION}`)")
    if "sets" not in top:
        raise c.fail("", "key 'sets' is missing")
    version = c.integer(top["schema_version"], "schema_version", "schema_version")
    if version != SCHEMA_VERSION:
        raise c.fail("schema_version", f"schema_version must be {SCHEMA_VERSION}, but got "
                                       f"{version} (this builder reads schema v{SCHEMA_VERSION})")

    d = c.mapping(top.get("defaults", {}), "defaults", "defaults", DEFAULT_KEYS)
    d_archs = c.archs(d["archs"], "defaults.archs") if "archs" in d else None
    d_acc = (c.acc_stages(d["acc_stages"], "defaults.acc_stages"), False) \
        if "acc_stages" in d else None
    d_opts = c.options(d["options"], "defaults.options") if "options" in d else {}
    c.def_opts = d_opts
    d_dtypes = (c.out_dtypes(d["out_dtypes"], "defaults.out_dtypes") if "out_dtypes" in d
                else DEFAULT_OUT_DTYPES)

    sets: list[SetSpec] = []
    where_named: dict[str, str] = {}
    raw_sets = c.listed(top["sets"], "sets", "sets")
    if len(raw_sets) > MAX_SETS:
        raise c.fail("sets", f"the file must have at most {MAX_SETS} sets, but got "
                             f"{len(raw_sets)}")
    for i, raw in enumerate(raw_sets):
        at = f"sets[{i}]"
        name = raw.get("name") if isinstance(raw, dict) else None
        # Name the set in every message once its name is known to be usable.
        named = (isinstance(name, str) and SET_NAME_RE.match(name) and len(name) <= MAX_SET_NAME
                 and name not in where_named)
        path = f"sets[{name}]" if named else at
        s = c.mapping(raw, path, "a set", SET_KEYS,
                      required=("name",) if isinstance(raw, dict) and "experts" in raw
                      else ("name", "groups"))
        if "experts" not in s:
            for key in ("n", "k"):
                if key in s:
                    raise c.fail(f"{path}.{key}", f"{key} is only allowed with experts (an "
                                                  f"expert layer: experts, n, k), but got "
                                                  f"{_got(s[key])}")
        if not isinstance(name, str) or not SET_NAME_RE.match(name):
            raise c.fail(f"{at}.name", "set name must match [A-Za-z0-9_-]+, but got "
                                       f"{_got(name)}")
        if len(name) > MAX_SET_NAME:
            raise c.fail(f"{at}.name", f"set name must be at most {MAX_SET_NAME} characters (it "
                                       "goes into the cubin's file name), but got "
                                       f"{len(name)}: {name[:40]}...")
        if name in where_named:
            raise c.fail(f"{at}.name", f"set name {name!r} is already used by "
                                       f"{where_named[name]}")
        where_named[name] = at
        if "archs" in s:
            archs = c.archs(s["archs"], f"{path}.archs")
        elif d_archs is not None:
            archs = d_archs
        else:
            raise c.fail(path, "key 'archs' is missing (and defaults gives no archs)")
        acc = (c.acc_stages(s["acc_stages"], f"{path}.acc_stages"), True) \
            if "acc_stages" in s else d_acc
        own_opts = c.options(s["options"], f"{path}.options") if "options" in s else {}
        # A set naming an arch it does not build is a typo or a stale line: say so.
        for key, table in (("acc_stages", acc[0] if acc and acc[1] else {}), ("options", own_opts)):
            for arch in table:
                if arch is not None and arch not in archs:
                    raise c.fail(f"{path}.{key}.{arch}", f"{key} are given for {arch}, but the "
                                                         f"set builds only {list(archs)}")
        if "experts" in s:
            own_opts = _serving_options(c.families, archs, own_opts)
        else:
            # Merged per arch, as resolve() merges them: a set's own options for an arch
            # replace none of the defaults' keys it does not name.
            for arch in {*d_opts, *own_opts}:
                opts = {**d_opts.get(arch, {}), **own_opts.get(arch, {})}
                if opts.get("device_offsets") and (arch is None or arch in archs):
                    raise c.fail(_options_where(path, arch, own_opts, d_opts),
                                 "device_offsets is only for expert sets (experts, n, k: the "
                                 "serving contract's kernels, which take device offsets), but "
                                 "it is set for this set of groups")
        builds = c.resolve(path, archs, acc, own_opts, d_opts)
        if "experts" in s:
            groups = c.experts(s, path, archs)
            dynamic, max_m = c.dynamic_m({**s, "m": DYNAMIC}, path)
        else:
            dynamic, max_m = c.dynamic_m(s, path)
            groups = c.groups(s["groups"], f"{path}.groups", archs, dynamic)
        c.max_m_fits(max_m, groups, path)
        c.groups_fit(builds, groups, path, own_opts)
        dtypes = (c.out_dtypes(s["out_dtypes"], f"{path}.out_dtypes") if "out_dtypes" in s
                  else d_dtypes)
        sets.append(SetSpec(name=name, groups=groups, builds=builds, dynamic_m=dynamic,
                            max_m=max_m, out_dtypes=dtypes))
    return ShapeSpec(source=source, sets=tuple(sets))
