"""runtime/records.py: the immutable record base the runtime's hot-path modules use instead of dataclasses."""
from __future__ import annotations

import pytest

from runtime.records import Frozen


class Point(Frozen):
    __slots__ = ("x", "y", "label")
    _DEFAULTS = {"label": ""}


def test_positional_keyword_and_default_fields() -> None:
    assert Point(1, 2) == Point(x=1, y=2, label="") == Point(1, y=2)
    assert Point(1, 2, "a").label == "a"
    assert repr(Point(1, 2)) == "Point(x=1, y=2, label='')"


def test_equality_and_hash_go_by_type_and_fields() -> None:
    class Other(Frozen):
        __slots__ = ("x", "y", "label")
    assert Point(1, 2) != Point(1, 3)
    assert Point(1, 2) != Other(1, 2, "")
    assert len({Point(1, 2), Point(1, 2), Point(2, 1)}) == 2


@pytest.mark.parametrize("args,kw,what", [
    ((1,), {}, "missing field 'y'"),
    ((1, 2, "a", 4), {}, "takes 3 fields"),
    ((1, 2), {"z": 3}, "no field 'z'"),
    ((1, 2), {"x": 3}, "field 'x' given twice"),
])
def test_bad_construction_names_the_field(args: tuple, kw: dict, what: str) -> None:
    with pytest.raises(TypeError, match=what):
        Point(*args, **kw)


def test_immutable() -> None:
    p = Point(1, 2)
    with pytest.raises(AttributeError, match="immutable"):
        p.x = 5      # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del p.x
    with pytest.raises(AttributeError):
        p.z = 1      # type: ignore[attr-defined]
