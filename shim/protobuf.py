"""A small protobuf (proto3) wire codec driven by field tables; the generated classes in shim/pb use it.

Owns varint/length-delimited/fixed encoding and decoding of messages. It must stay stdlib-only and
cheap to import: the shim loads it on every start (no google.protobuf, a heavy import, in every shim).
"""
from __future__ import annotations

import struct

# Field kinds. Scalars that share a wire encoding share a code path below.
STRING = "string"
BYTES = "bytes"
BOOL = "bool"
UINT32 = "uint32"
UINT64 = "uint64"
INT32 = "int32"
INT64 = "int64"
ENUM = "enum"
DOUBLE = "double"
MESSAGE = "message"
MAP = "map"          # map<string, string> (the only map the task API has)

_VARINT_KINDS = frozenset((BOOL, UINT32, UINT64, INT32, INT64, ENUM))
_DEFAULTS: dict[str, Any] = {STRING: "", BYTES: b"", BOOL: False, UINT32: 0, UINT64: 0, INT32: 0,
                             INT64: 0, ENUM: 0, DOUBLE: 0.0}

# Messages nest at most this deep; deeper input is rejected rather than recursing without bound.
MAX_DEPTH = 64

_REGISTRY: dict[str, type["Message"]] = {}


class DecodeError(ValueError):
    """The bytes are not a valid encoding of the message; the text names the field and the reason."""


class Field:
    __slots__ = ("number", "name", "kind", "type_name", "repeated")

    def __init__(self, number: int, name: str, kind: str, type_name: str = "", repeated: bool = False) -> None:
        self.number = number
        self.name = name
        self.kind = kind
        self.type_name = type_name   # full name of the message type for MESSAGE fields
        self.repeated = repeated

    def default(self) -> Any:
        if self.kind == MAP:
            return {}
        if self.repeated:
            return []
        if self.kind == MESSAGE:
            return None
        return _DEFAULTS[self.kind]


def lookup(full_name: str) -> type["Message"]:
    """The generated class for a protobuf full name (e.g. `containerd.task.v2.CreateTaskRequest`)."""
    return _REGISTRY[full_name]


class Message:
    """Base of generated messages: attributes named like the proto fields, proto3 defaults."""

    __slots__ = ()
    FULL_NAME = ""
    FIELDS: tuple = ()
    _BY_NUMBER: dict = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls._BY_NUMBER = {f.number: f for f in cls.FIELDS}
        if cls.FULL_NAME:
            _REGISTRY[cls.FULL_NAME] = cls

    def __init__(self, **values: Any) -> None:
        for f in self.FIELDS:
            object.__setattr__(self, f.name, values.pop(f.name) if f.name in values else f.default())
        if values:
            raise TypeError(f"{self.FULL_NAME} has no field(s) {', '.join(sorted(values))}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in self.FIELDS)

    def __repr__(self) -> str:
        parts = []
        for f in self.FIELDS:
            v = getattr(self, f.name)
            if v != f.default():
                parts.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    # --- encoding ------------------------------------------------------------------------
    def encode(self) -> bytes:
        out = bytearray()
        for f in self.FIELDS:
            v = getattr(self, f.name)
            if f.kind == MAP:
                for k in sorted(v):
                    entry = bytearray()
                    _put_len(entry, 1, str(k).encode())
                    _put_len(entry, 2, str(v[k]).encode())
                    _put_len(out, f.number, bytes(entry))
            elif f.repeated:
                if not v:
                    continue
                if f.kind in _VARINT_KINDS:
                    packed = bytearray()
                    for item in v:
                        _put_varint(packed, _varint_value(f.kind, item))
                    _put_len(out, f.number, bytes(packed))
                else:
                    for item in v:
                        _encode_one(out, f, item)
            elif f.kind == MESSAGE:
                if v is not None:
                    _encode_one(out, f, v)
            elif v != _DEFAULTS[f.kind]:
                _encode_one(out, f, v)
        return bytes(out)

    # --- decoding ------------------------------------------------------------------------
    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, _depth: int = 0) -> "Message":
        if _depth > MAX_DEPTH:
            raise DecodeError(f"{cls.FULL_NAME}: nested deeper than {MAX_DEPTH}")
        msg = cls()
        buf = memoryview(data)
        pos, end = 0, len(buf)
        by_number = cls._BY_NUMBER
        while pos < end:
            key, pos = _get_varint(buf, pos, cls.FULL_NAME)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise DecodeError(f"{cls.FULL_NAME}: field number 0")
            f = by_number.get(number)
            if wire == 0:
                raw, pos = _get_varint(buf, pos, cls.FULL_NAME)
                if f is not None:
                    _set_scalar(msg, f, _from_varint(f, raw, cls.FULL_NAME))
            elif wire == 2:
                n, pos = _get_varint(buf, pos, cls.FULL_NAME)
                if n > end - pos:
                    raise DecodeError(f"{cls.FULL_NAME}: field {number} length {n} runs past the end")
                chunk = buf[pos:pos + n]
                pos += n
                if f is not None:
                    _set_len(msg, f, chunk, _depth, cls.FULL_NAME)
            elif wire == 1:
                if end - pos < 8:
                    raise DecodeError(f"{cls.FULL_NAME}: field {number} truncated fixed64")
                if f is not None and f.kind == DOUBLE:
                    _set_scalar(msg, f, struct.unpack_from("<d", buf, pos)[0])
                pos += 8
            elif wire == 5:
                if end - pos < 4:
                    raise DecodeError(f"{cls.FULL_NAME}: field {number} truncated fixed32")
                pos += 4
            else:
                raise DecodeError(f"{cls.FULL_NAME}: field {number} has unsupported wire type {wire}")
        return msg


def _set_scalar(msg: Message, f: Field, value: Any) -> None:
    if f.kind in (STRING, BYTES, MESSAGE, MAP):
        raise DecodeError(f"{msg.FULL_NAME}.{f.name}: a varint/fixed value for a {f.kind} field")
    if f.repeated:
        getattr(msg, f.name).append(value)
    else:
        object.__setattr__(msg, f.name, value)


def _set_len(msg: Message, f: Field, chunk: memoryview, depth: int, where: str) -> None:
    if f.kind == MAP:
        entry = _MapEntry.decode(chunk, depth + 1)
        getattr(msg, f.name)[entry.key] = entry.value
        return
    if f.kind in _VARINT_KINDS:
        if not f.repeated:
            raise DecodeError(f"{where}.{f.name}: length-delimited data for a {f.kind} field")
        out = getattr(msg, f.name)
        pos = 0
        while pos < len(chunk):
            raw, pos = _get_varint(chunk, pos, where)
            out.append(_from_varint(f, raw, where))
        return
    if f.kind == STRING:
        try:
            value: Any = str(chunk, "utf-8")
        except UnicodeDecodeError as err:
            raise DecodeError(f"{where}.{f.name}: invalid UTF-8 ({err.reason})") from None
    elif f.kind == BYTES:
        value = bytes(chunk)
    elif f.kind == MESSAGE:
        value = lookup(f.type_name).decode(chunk, depth + 1)
    else:
        raise DecodeError(f"{where}.{f.name}: length-delimited data for a {f.kind} field")
    if f.repeated:
        getattr(msg, f.name).append(value)
    else:
        object.__setattr__(msg, f.name, value)


def _varint_value(kind: str, v: Any) -> int:
    if kind == BOOL:
        return 1 if v else 0
    v = int(v)
    if v < 0:
        if kind in (UINT32, UINT64):
            raise ValueError(f"negative value {v} for a {kind} field")
        v &= (1 << 64) - 1
    return v


def _from_varint(f: Field, raw: int, where: str) -> Any:
    kind = f.kind
    if kind == BOOL:
        return raw != 0
    if kind == UINT32:
        return raw & 0xFFFFFFFF
    if kind in (INT32, ENUM):
        raw &= 0xFFFFFFFF
        return raw - (1 << 32) if raw & 0x80000000 else raw
    if kind == INT64:
        return raw - (1 << 64) if raw & (1 << 63) else raw
    if kind == UINT64:
        return raw
    raise DecodeError(f"{where}.{f.name}: a varint for a {kind} field")


def _encode_one(out: bytearray, f: Field, v: Any) -> None:
    kind = f.kind
    if kind in _VARINT_KINDS:
        _put_varint(out, f.number << 3)
        _put_varint(out, _varint_value(kind, v))
    elif kind == STRING:
        _put_len(out, f.number, v.encode())
    elif kind == BYTES:
        _put_len(out, f.number, bytes(v))
    elif kind == MESSAGE:
        _put_len(out, f.number, v.encode())
    elif kind == DOUBLE:
        _put_varint(out, f.number << 3 | 1)
        out += struct.pack("<d", v)
    else:
        raise TypeError(f"cannot encode field {f.name} of kind {kind}")


def _put_varint(out: bytearray, v: int) -> None:
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _put_len(out: bytearray, number: int, data: bytes) -> None:
    _put_varint(out, number << 3 | 2)
    _put_varint(out, len(data))
    out += data


def _get_varint(buf: memoryview, pos: int, where: str) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise DecodeError(f"{where}: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError(f"{where}: varint longer than 10 bytes")


def encode_varint(v: int) -> bytes:
    out = bytearray()
    _put_varint(out, v)
    return bytes(out)


class _MapEntry(Message):
    __slots__ = ("key", "value")
    FULL_NAME = ""
    FIELDS = (Field(1, "key", STRING), Field(2, "value", STRING))
