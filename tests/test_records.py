"""runtime.records: the frozen records the manifest parses into (no dataclasses: cold start)."""

from __future__ import annotations

import pickle

import pytest

from runtime.manifest import Grid, Limits, Param, TmaGeometry
from runtime.records import Record, asdict, fields


class Point(Record):
    x: int
    y: int
    label: str = "p"
    tags: tuple[str, ...] = ()


def test_fields_defaults_and_construction() -> None:
    assert fields(Point) == ("x", "y", "label", "tags") == Point.__slots__
    assert Point(1, 2) == Point(x=1, y=2, label="p", tags=())
    assert Point(1, y=2, label="q").label == "q"
    for args, kwargs, message in (
            ((1,), {}, "Point is missing field 'y'"),
            ((1, 2), {"z": 3}, "Point has no field 'z'"),
            ((1, 2), {"x": 3}, "Point got field 'x' twice"),
            ((1, 2, "a", (), 5), {}, "Point takes at most 4 positional arguments, but got 5")):
        with pytest.raises(TypeError) as info:
            Point(*args, **kwargs)
        assert str(info.value) == message


def test_frozen_equal_hash_repr() -> None:
    p = Point(1, 2)
    with pytest.raises(AttributeError, match="cannot assign to field 'x' of a frozen Point"):
        p.x = 3
    with pytest.raises(AttributeError):
        p.other = 3
    with pytest.raises(AttributeError, match="cannot delete field 'x'"):
        del p.x
    assert p == Point(1, 2) and p != Point(1, 3) and hash(p) == hash(Point(1, 2))
    assert (p == (1, 2, "p", ())) is False  # only a record of the same class is equal
    assert repr(p) == "Point(x=1, y=2, label='p', tags=())"


def test_replace_pickle_and_asdict() -> None:
    p = Point(1, 2, tags=("a",))
    q = p.replace(y=5)
    assert (p.y, q.y, q.tags) == (2, 5, ("a",))
    with pytest.raises(TypeError, match="no field 'z'"):
        p.replace(z=1)
    assert pickle.loads(pickle.dumps(q)) == q
    geo = TmaGeometry("UINT8", (128, 64), (128,), (128, 64), (1, 1))
    param = Param("tma_b", "tma_template", 0, 128, 64, operand="b", tma=geo)
    assert asdict(param)["tma"] == {
        "dtype": "UINT8", "dims": (128, 64), "strides": (128,), "box": (128, 64),
        "element_strides": (1, 1), "swizzle": "NONE", "interleave": "NONE",
        "l2_promotion": "NONE", "oob_fill": "NONE"}
    assert pickle.loads(pickle.dumps(param)) == param


def test_manifest_records_keep_their_json_forms() -> None:
    """record() of the launch facts: the dict the kernel family returned, defaults left out."""
    assert Grid("persistent", 1).record() == {"policy": "persistent", "ctas_per_sm": 1}
    assert Grid("persistent", 1, cooperative=True).record() == {
        "policy": "persistent", "ctas_per_sm": 1, "cooperative": True}
    assert Limits(k_multiple=64, n_multiple=8).record() == {"k_multiple": 64, "n_multiple": 8}
