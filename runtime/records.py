"""Frozen records without `dataclasses`: what the manifest parses into at `runtime.load`.

A frozen dataclass costs about 0.6 ms to create at import (it compiles its generated methods),
and runtime/manifest.py's twelve were about 8 ms of every serving process's cold start
(docs/lab_notebook.md, eighteenth session). A `Record` subclass is written like a frozen
dataclass (annotated fields in order, defaults after them) and behaves like one where this
project uses it: keyword or positional construction, read-only fields, equality and hash by
value, repr, pickling, `fields()`, `asdict()` and `replace()`. Nothing is compiled: the metaclass
turns the annotations into `__slots__` and moves the defaults aside.
"""

from __future__ import annotations

from typing import Any


class _RecordMeta(type):
    def __new__(mcls, name: str, bases: tuple, ns: dict[str, Any]) -> _RecordMeta:
        # Underscored annotations are the class's own bookkeeping, not fields.
        names = tuple(k for k in ns.get("__annotations__", {}) if not k.startswith("_"))
        defaults = {k: ns.pop(k) for k in names if k in ns}
        ns["__slots__"] = names
        ns["_fields"] = names
        ns["_defaults"] = defaults
        return super().__new__(mcls, name, bases, ns)


class Record(metaclass=_RecordMeta):
    """Base of the frozen records (module docstring). Subclasses declare fields only; they do
    not subclass each other."""

    _fields: tuple[str, ...]
    _defaults: dict[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self._fields
        if args:
            if len(args) > len(names):
                raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional "
                                f"arguments, but got {len(args)}")
            for k in names[:len(args)]:
                if k in kwargs:
                    raise TypeError(f"{type(self).__name__} got field {k!r} twice")
            kwargs.update(zip(names, args))
        # One pass, no intermediate dict: the manifest builds some 1,800 records at load.
        setter, defaults, used = object.__setattr__, self._defaults, 0
        for k in names:
            if k in kwargs:
                setter(self, k, kwargs[k])
                used += 1
            elif k in defaults:
                setter(self, k, defaults[k])
            else:
                raise TypeError(f"{type(self).__name__} is missing field {k!r}")
        if used != len(kwargs):
            unknown = next(k for k in kwargs if k not in names)
            raise TypeError(f"{type(self).__name__} has no field {unknown!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen "
                             f"{type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def _values(self) -> tuple:
        return tuple(getattr(self, k) for k in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self) -> tuple:
        return (self.__class__, self._values())

    def replace(self, **changes: Any) -> Any:
        """A copy with `changes` (dataclasses.replace)."""
        return self.__class__(**{**{k: getattr(self, k) for k in self._fields}, **changes})


def fields(record: Record | type[Record]) -> tuple[str, ...]:
    """The field names, in order."""
    return record._fields


def asdict(value: Any) -> Any:
    """Records as dicts, recursively through records, lists, tuples and dicts
    (dataclasses.asdict)."""
    if isinstance(value, Record):
        return {k: asdict(getattr(value, k)) for k in value._fields}
    if isinstance(value, (list, tuple)):
        return type(value)(asdict(v) for v in value)
    if isinstance(value, dict):
        return {asdict(k): asdict(v) for k, v in value.items()}
    return value
