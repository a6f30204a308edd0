"""Immutable records for the runtime's hot path, without `dataclasses` (which imports inspect, re, enum and
more: ~8-10 ms in every fresh interpreter that runs a verb).

Owns only the record mechanics: fields are the subclass's `__slots__`, optional defaults its `_DEFAULTS`;
equality, hashing and repr go by those fields, as a frozen dataclass's do. What a record means is its module's.
"""
from __future__ import annotations


class Frozen:
    """Base of an immutable record: `class Insn(Frozen): __slots__ = ("code", "dst"); _DEFAULTS = {"dst": 0}`.

    Built positionally or by keyword like a frozen dataclass (a missing field without a default, an unknown or
    repeated one: TypeError); assigning or deleting an attribute afterwards raises AttributeError. A subclass
    may define its own __init__ and set its fields with `_set`."""
    __slots__: tuple[str, ...] = ()
    _DEFAULTS: dict[str, object] = {}

    def __init__(self, *args: object, **kw: object) -> None:
        names = self.__slots__
        cls = type(self).__name__
        if len(args) > len(names):
            raise TypeError(f"{cls}: takes {len(names)} fields, got {len(args)} positional values")
        values = dict(zip(names, args))
        for name, value in kw.items():
            if name not in names:
                raise TypeError(f"{cls}: no field {name!r}")
            if name in values:
                raise TypeError(f"{cls}: field {name!r} given twice")
            values[name] = value
        for name in names:
            if name not in values:
                if name not in self._DEFAULTS:
                    raise TypeError(f"{cls}: missing field {name!r}")
                values[name] = self._DEFAULTS[name]
        self._set(**values)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _set(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in self.__slots__))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"
