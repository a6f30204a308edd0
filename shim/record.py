"""A minimal record base class (slots, keyword init with defaults, repr, eq, as_dict) for the shim's records.

`dataclasses` imports `inspect` (and with it ast, dis, tokenize, re): ~2.7 MB private per process. The shim
runs once per container, so its records use this instead; the fields table doubles as documentation.
"""
from __future__ import annotations


class Record:
    __slots__ = ()
    FIELDS: tuple = ()          # ((name, default), ...); a default of list/dict is copied per instance

    def __init__(self, *args: object, **kw: object) -> None:
        names = [f[0] for f in self.FIELDS]
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}: too many positional arguments")
        for name, value in zip(names, args):
            if name in kw:
                raise TypeError(f"{type(self).__name__}: {name} given twice")
            kw[name] = value
        for name, default in self.FIELDS:
            if name in kw:
                value = kw.pop(name)
            elif default is REQUIRED:
                raise TypeError(f"{type(self).__name__}: missing field {name}")
            elif isinstance(default, (list, dict)):
                value = type(default)()
            else:
                value = default
            object.__setattr__(self, name, value)
        if kw:
            raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(sorted(kw))}")

    def as_dict(self) -> dict:
        return {n: getattr(self, n) for n, _ in self.FIELDS}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n, _ in self.FIELDS)})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n, _ in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()
