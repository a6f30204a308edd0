"""A small blocking D-Bus client: bus addresses, SASL EXTERNAL, the wire format and message framing, over unix sockets.

Owns connecting (one deadline for connect, auth and Hello), marshalling with the spec's checks in both directions
(unix fds, `h`, are read as their u32 index and never written: this client negotiates no fds), cutting the byte
stream into messages, and calls that wait for their reply. Only a broken stream (framing) ends a connection: a
whole message that cannot be read is dropped, since anyone on a bus can send us one.
Must not know any service (systemd's calls are runtime/cgroups/systemd_dbus.py) and must stay cheap to import:
builtins-level modules only (no typing, logging, re, enum, collections, socket): every `husk` verb run with
--systemd-cgroup is a fresh interpreter that pays for them.

Python values, as jeepney maps them: y n q i u x t -> int, b -> bool, d -> float, s o g -> str, ay -> bytes,
a{kv} -> dict, other arrays -> list, structs -> tuple, a variant -> (signature, value).
"""
from __future__ import annotations

import _socket
import _struct  # what `struct` wraps, without its import
import os
import time

from runtime import logutil
from runtime.errors import SetupError

TYPE_CHECKING = False  # typing costs ~2 ms to import; annotations are strings here
if TYPE_CHECKING:
    from collections.abc import Callable

log = logutil.Logger(__name__)

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
BUS_NAME = "org.freedesktop.DBus"       # the bus itself: destination of Hello/AddMatch, sender of its replies
BUS_PATH = "/org/freedesktop/DBus"
MAX_MESSAGE = 1 << 27                   # the spec's limits: 128 MiB a message, 64 MiB an array
MAX_ARRAY = 1 << 26
MAX_DEPTH = 64                          # containers and variants around a value (32 arrays + 32 structs)
MAX_NESTING = 32                        # in a signature: arrays in a row, structs, dict entries (each on its own)
MAX_LINE = 16384                        # a longer SASL line is not from a D-Bus server
_RECV_MAX = 1 << 20
_LOGGED_DROPS = 10                      # per connection: anyone on a bus can send what we cannot read
MAX_HELD = 4096                         # signals kept for receive() while calls wait (beyond: the oldest go),
MAX_HELD_BYTES = 16 << 20               # and their bytes on the wire


class DBusProtocolError(SetupError):
    """Bytes or values that break the D-Bus specification, sent or received; the message names the signature
    (or header field) and the value."""


class UndecodableMessage(DBusProtocolError):
    """A whole message, cut from the stream by its declared length, that breaks the specification (or uses what
    this client cannot read). The stream is still in step: the message is dropped, unless it is the awaited reply.
    `message` has its type, flags and serial, and the header fields that could be read; no body."""

    def __init__(self, text: str, message: Message) -> None:
        super().__init__(text)
        self.message = message


class DBusAddressError(DBusProtocolError):
    """A bus address that cannot be parsed or has no unix socket in it; the message quotes the address."""


class DBusAuthError(SetupError):
    """The server refused SASL EXTERNAL authentication."""


class DBusError(SetupError):
    """An error reply: `name` is the D-Bus error name, `text` its message; `what` says which call got it."""

    def __init__(self, what: str, name: str, text: str) -> None:
        super().__init__(f"{what}: {name}: {text}" if text else f"{what}: {name}")
        self.name = name
        self.text = text


class ConnectionClosed(ConnectionError):
    """The peer closed the connection, or an earlier failure left the stream unusable (an OSError, like every
    transport failure here; timeouts are the builtin TimeoutError)."""


# --- signatures ---------------------------------------------------------------------------------------------
# A parsed complete type (a "node"): its type code for a basic type or a variant; ("a", text, element node) for
# an array; ("a{", text, key code, value node) for a dict; ("(", text, field nodes) for a struct.
_FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q", "d": "d", "h": "I"}
_LE = {code: _struct.Struct("<" + f) for code, f in _FIXED.items()}
_BE = {code: _struct.Struct(">" + f) for code, f in _FIXED.items()}
_RANGE = {"y": (0, 0xFF), "n": (-0x8000, 0x7FFF), "q": (0, 0xFFFF), "i": (-(1 << 31), (1 << 31) - 1),
          "u": (0, (1 << 32) - 1), "x": (-(1 << 63), (1 << 63) - 1), "t": (0, (1 << 64) - 1)}
_ALIGN = {"y": 1, "g": 1, "v": 1, "n": 2, "q": 2, "b": 4, "i": 4, "u": 4, "h": 4, "s": 4, "o": 4, "a": 4, "a{": 4,
          "x": 8, "t": 8, "d": 8, "(": 8}
_BASIC = "ybnqiuxtdsogh"
_U32 = _LE["u"]
_sigs: dict[str, tuple] = {}


def parse_signature(sig: str) -> tuple:
    """The complete types of `sig` as nodes (see above); DBusProtocolError names what is wrong with it."""
    nodes = _sigs.get(sig) if type(sig) is str else None
    if nodes is not None:
        return nodes
    if not isinstance(sig, str):
        raise DBusProtocolError(f"D-Bus signature {sig!r}: not a str")
    if len(sig) > 255:
        raise DBusProtocolError(f"D-Bus signature {sig[:40]!r}...: {len(sig)} characters, over 255")
    out, i = [], 0
    while i < len(sig):
        node, i = _parse_type(sig, i, 0, 0, 0)
        out.append(node)
    nodes = tuple(out)
    if len(_sigs) < 256:          # signatures come from peers too: a bounded cache
        _sigs[sig] = nodes
    return nodes


def _parse_type(sig: str, i: int, arrays: int, structs: int, dicts: int) -> tuple:
    """One complete type at `i`. Nesting is counted as libdbus validates signatures (dbus-marshal-validate.c), which
    is what a bus forwards: array codes in a row (a struct or dict entry between two starts a new row), structs and
    dict entries each on their own, 32 of each; the body's values are then limited to MAX_DEPTH (see _read)."""
    if i >= len(sig):
        raise _sig_error(sig, "it ends inside a container")
    c = sig[i]
    if c in _BASIC or c == "v":
        return c, i + 1
    if c == "a":
        if arrays == MAX_NESTING:
            raise _sig_error(sig, f"arrays nested deeper than {MAX_NESTING}")
        if sig[i + 1:i + 2] != "{":
            elem, j = _parse_type(sig, i + 1, arrays + 1, structs, dicts)
            return ("a", sig[i:j], elem), j
        if dicts == MAX_NESTING:
            raise _sig_error(sig, f"dict entries nested deeper than {MAX_NESTING}")
        key = sig[i + 2:i + 3]
        if not key or key not in _BASIC:
            raise _sig_error(sig, f"the dict at {i} needs a basic type as its key")
        value, j = _parse_type(sig, i + 3, 0, structs, dicts + 1)
        if sig[j:j + 1] != "}":
            raise _sig_error(sig, f"the dict entry at {i + 1} must hold exactly a key and a value")
        return ("a{", sig[i:j + 1], sig[i + 2], value), j + 1
    if c == "(":
        if structs == MAX_NESTING:
            raise _sig_error(sig, f"structs nested deeper than {MAX_NESTING}")
        fields, j = [], i + 1
        while sig[j:j + 1] != ")":
            field, j = _parse_type(sig, j, 0, structs + 1, dicts)
            fields.append(field)
        if not fields:
            raise _sig_error(sig, f"an empty struct at {i}")
        return ("(", sig[i:j + 1], tuple(fields)), j + 1
    raise _sig_error(sig, f"unexpected {c!r} at {i}")


def _sendable(sig: str) -> tuple:
    """parse_signature(sig) for what we send: never a unix fd (no fds are negotiated, so none could go along)."""
    nodes = parse_signature(sig)
    if "h" in sig:
        raise _sig_error(sig, "unix fds (type 'h') are not sent by this client")
    return nodes


def _sig_error(sig: str, reason: str) -> DBusProtocolError:
    return DBusProtocolError(f"D-Bus signature {sig!r}: {reason}")


def _show(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _value_error(sig: str, v: object, reason: str) -> DBusProtocolError:
    return DBusProtocolError(f"D-Bus type {sig!r}: {_show(v)} ({type(v).__name__}) {reason}")


# --- names --------------------------------------------------------------------------------------------------
_DIGITS = frozenset("0123456789")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_") | _DIGITS
_BUS_CHARS = _NAME_CHARS | {"-"}


def valid_object_path(p: str) -> bool:
    if p == "/":
        return True
    parts = p.split("/")
    return p[:1] == "/" and all(part and set(part) <= _NAME_CHARS for part in parts[1:])


def valid_member(s: str) -> bool:
    return 0 < len(s) <= 255 and s[0] not in _DIGITS and set(s) <= _NAME_CHARS


def _dotted(s: str, chars: frozenset, digit_first: bool) -> bool:
    parts = s.split(".")
    return len(parts) > 1 and all(p and set(p) <= chars and (digit_first or p[0] not in _DIGITS) for p in parts)


def valid_interface(s: str) -> bool:
    """An interface or error name."""
    return len(s) <= 255 and _dotted(s, _NAME_CHARS, False)


def valid_bus_name(s: str) -> bool:
    if not 0 < len(s) <= 255:
        return False
    return _dotted(s[1:], _BUS_CHARS, True) if s[0] == ":" else _dotted(s, _BUS_CHARS, False)


# --- marshalling (always little-endian) ------------------------------------------------------------------------
def _pad(buf: bytearray, n: int) -> None:
    r = len(buf) % n
    if r:
        buf += bytes(n - r)


def _utf8(code: str, v: object) -> bytes:
    if not isinstance(v, str):
        raise _value_error(code, v, "is not a str")
    if "\0" in v:
        raise _value_error(code, v, "contains a NUL character")
    try:
        return v.encode()
    except UnicodeEncodeError:
        raise _value_error(code, v, "cannot be UTF-8 (a lone surrogate)") from None


def _write(buf: bytearray, node: str | tuple, v: object, depth: int) -> None:
    if type(node) is str:
        if node in _RANGE:
            if isinstance(v, bool) or not isinstance(v, int):
                raise _value_error(node, v, "is not an int")
            lo, hi = _RANGE[node]
            if not lo <= v <= hi:
                raise _value_error(node, v, f"is out of range {lo}..{hi}")
            _pad(buf, _ALIGN[node])
            buf += _LE[node].pack(v)
        elif node == "b":
            # 0 or 1 only: dbus-daemon drops a connection that sends another value
            if v is not True and v is not False and not (type(v) is int and v in (0, 1)):
                raise _value_error(node, v, "is not a bool (or 0/1)")
            _pad(buf, 4)
            buf += _U32.pack(1 if v else 0)
        elif node == "d":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise _value_error(node, v, "is not a float")
            try:
                packed = _LE["d"].pack(float(v))
            except OverflowError:
                raise _value_error(node, v, "is too large for a double") from None
            _pad(buf, 8)
            buf += packed
        elif node == "s" or node == "o":
            data = _utf8(node, v)
            if node == "o" and not valid_object_path(v):  # type: ignore[arg-type]
                raise _value_error(node, v, "is not an object path")
            _pad(buf, 4)
            buf += _U32.pack(len(data))
            buf += data
            buf.append(0)
        elif node == "g":
            data = _utf8(node, v)
            _sendable(v)  # type: ignore[arg-type]
            buf.append(len(data))
            buf += data
            buf.append(0)
        else:   # "v"
            if not isinstance(v, (tuple, list)) or len(v) != 2 or not isinstance(v[0], str):
                raise _value_error(node, v, "is not a (signature, value) pair")
            inner = _sendable(v[0])
            if len(inner) != 1:
                raise _value_error(node, v, "has a signature that is not one complete type")
            if depth >= MAX_DEPTH:
                raise _value_error(node, v, f"is nested deeper than {MAX_DEPTH}")
            _write(buf, "g", v[0], depth)
            _write(buf, inner[0], v[1], depth + 1)
        return
    kind, text = node[0], node[1]
    if (depth + 2 if kind == "a{" else depth + 1) > MAX_DEPTH:     # as _read counts, but even when empty
        raise _value_error(text, v, f"is nested deeper than {MAX_DEPTH}")
    if kind == "(":
        fields = node[2]
        if not isinstance(v, (tuple, list)) or len(v) != len(fields):
            raise _value_error(text, v, f"is not a tuple of {len(fields)}")
        _pad(buf, 8)
        for field, x in zip(fields, v):
            _write(buf, field, x, depth + 1)
        return
    _pad(buf, 4)
    at = len(buf)
    buf += b"\0\0\0\0"
    if kind == "a{":
        if not isinstance(v, dict):
            raise _value_error(text, v, "is not a dict")
        _pad(buf, 8)
        start = len(buf)
        for key, x in v.items():
            _pad(buf, 8)
            _write(buf, node[2], key, depth + 2)
            _write(buf, node[3], x, depth + 2)
    else:
        elem = node[2]
        _pad(buf, _ALIGN[elem if type(elem) is str else elem[0]])
        start = len(buf)
        if elem == "y" and isinstance(v, (bytes, bytearray, memoryview)):
            buf += v
        elif isinstance(v, (list, tuple)):
            for x in v:
                _write(buf, elem, x, depth + 1)
        else:
            raise _value_error(text, v, "is not a list" + (" or bytes" if elem == "y" else ""))
    n = len(buf) - start
    if n > MAX_ARRAY:
        raise DBusProtocolError(f"D-Bus type {text!r}: an array of {n} bytes, over the 64 MiB limit")
    _U32.pack_into(buf, at, n)


def encode_values(signature: str, values: tuple | list) -> bytes:
    """`values` marshalled as `signature` from an 8-aligned offset (a message body)."""
    nodes = _sendable(signature)
    if not isinstance(values, (tuple, list)) or len(values) != len(nodes):
        raise DBusProtocolError(f"D-Bus signature {signature!r}: {len(nodes)} values expected, got {_show(values)}")
    buf = bytearray()
    for node, v in zip(nodes, values):
        _write(buf, node, v, 0)
    return bytes(buf)


# --- unmarshalling (either byte order) -------------------------------------------------------------------------
def _short(sig: str, pos: int) -> DBusProtocolError:
    return DBusProtocolError(f"D-Bus type {sig!r} at byte {pos}: the data ends before the value")


def _skip(data: bytes, pos: int, n: int, end: int, sig: str) -> int:
    new = (pos + n - 1) & -n
    if new > end:
        raise _short(sig, pos)
    if new != pos and any(data[pos:new]):
        raise DBusProtocolError(f"D-Bus type {sig!r} at byte {pos}: padding that is not zero")
    return new


def _string_at(data: bytes, pos: int, n: int, end: int, sig: str) -> str:
    if pos + n + 1 > end:
        raise _short(sig, pos)
    raw = data[pos:pos + n]
    if data[pos + n] != 0 or 0 in raw:
        raise DBusProtocolError(f"D-Bus type {sig!r} at byte {pos}: not a NUL-terminated string without NULs")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise DBusProtocolError(f"D-Bus type {sig!r} at byte {pos}: not valid UTF-8: {_show(raw)}") from None


def _too_deep(sig: str, pos: int) -> DBusProtocolError:
    return DBusProtocolError(f"D-Bus type {sig!r} at byte {pos}: its contents are nested deeper than {MAX_DEPTH}")


def _read(data: bytes, pos: int, end: int, node: str | tuple, fmt: dict, depth: int) -> tuple[object, int]:
    if type(node) is str:
        if node in _FIXED:
            size = _ALIGN[node]
            pos = _skip(data, pos, size, end, node)
            if pos + size > end:
                raise _short(node, pos)
            v = fmt[node].unpack_from(data, pos)[0]
            if node == "b":
                if v > 1:
                    raise DBusProtocolError(f"D-Bus type 'b' at byte {pos}: {v} is neither 0 nor 1")
                v = v == 1
            return v, pos + size
        if node == "s" or node == "o":
            pos = _skip(data, pos, 4, end, node)
            if pos + 4 > end:
                raise _short(node, pos)
            n = fmt["u"].unpack_from(data, pos)[0]
            text = _string_at(data, pos + 4, n, end, node)
            if node == "o" and not valid_object_path(text):
                raise DBusProtocolError(f"D-Bus type 'o' at byte {pos}: {_show(text)} is not an object path")
            return text, pos + 5 + n
        if node == "g":
            if pos >= end:
                raise _short(node, pos)
            n = data[pos]
            text = _string_at(data, pos + 1, n, end, node)
            parse_signature(text)
            return text, pos + 2 + n
        if depth >= MAX_DEPTH:     # "v"
            raise _too_deep("v", pos)
        sig, pos = _read(data, pos, end, "g", fmt, depth)
        inner = parse_signature(sig)  # type: ignore[arg-type]
        if len(inner) != 1:
            raise DBusProtocolError(f"D-Bus variant at byte {pos}: signature {sig!r} is not one complete type")
        value, pos = _read(data, pos, end, inner[0], fmt, depth + 1)
        return (sig, value), pos
    # As libdbus counts (validate_body_helper): the contents of a container are one deeper (a dict's keys and
    # values two: its entries are structs), and only contents that are read count (not those of an empty array,
    # nor the numbers of an array of them), with at most MAX_DEPTH containers and variants around a value.
    kind, text = node[0], node[1]
    if kind == "(":
        if depth >= MAX_DEPTH:
            raise _too_deep(text, pos)
        pos = _skip(data, pos, 8, end, text)
        fields = []
        for field in node[2]:
            v, pos = _read(data, pos, end, field, fmt, depth + 1)
            fields.append(v)
        return tuple(fields), pos
    pos = _skip(data, pos, 4, end, text)
    if pos + 4 > end:
        raise _short(text, pos)
    n = fmt["u"].unpack_from(data, pos)[0]
    if n > MAX_ARRAY:
        raise DBusProtocolError(f"D-Bus type {text!r} at byte {pos}: an array of {n} bytes, over the 64 MiB limit")
    elem = node[2]
    pos = _skip(data, pos + 4, 8 if kind == "a{" else _ALIGN[elem if type(elem) is str else elem[0]], end, text)
    stop = pos + n
    if stop > end:
        raise DBusProtocolError(f"D-Bus type {text!r} at byte {pos}: an array of {n} bytes runs past its container")
    if kind == "a{":
        if n and depth + 2 > MAX_DEPTH:
            raise _too_deep(text, pos)
        d = {}
        while pos < stop:
            pos = _skip(data, pos, 8, stop, text)
            key, pos = _read(data, pos, stop, elem, fmt, depth + 2)
            d[key], pos = _read(data, pos, stop, node[3], fmt, depth + 2)
        return d, pos
    if n and depth >= MAX_DEPTH and (type(elem) is not str or elem not in _FIXED):
        raise _too_deep(text, pos)
    if elem == "y":
        return bytes(data[pos:stop]), stop
    items = []
    while pos < stop:
        v, pos = _read(data, pos, stop, elem, fmt, depth + 1)
        items.append(v)
    return items, pos


def decode_values(signature: str, data: bytes, big_endian: bool = False) -> tuple:
    """The values of `signature` in `data` (marshalled from an 8-aligned offset), which they must fill exactly."""
    pos, out, fmt = 0, [], _BE if big_endian else _LE
    for node in parse_signature(signature):
        v, pos = _read(data, pos, len(data), node, fmt, 0)
        out.append(v)
    if pos != len(data):
        raise DBusProtocolError(f"D-Bus signature {signature!r}: {len(data) - pos} bytes left after the values")
    return tuple(out)


# --- messages -------------------------------------------------------------------------------------------------
class Message:
    """One D-Bus message. `serial` is set by the connection that sends it, or read from the wire."""
    __slots__ = ("type", "flags", "serial", "path", "interface", "member", "error_name", "reply_serial",
                 "destination", "sender", "signature", "body")

    def __init__(self, type: int, *, path: str | None = None, interface: str | None = None,
                 member: str | None = None, error_name: str | None = None, reply_serial: int | None = None,
                 destination: str | None = None, sender: str | None = None, signature: str = "",
                 body: tuple = (), flags: int = 0, serial: int = 0) -> None:
        self.type, self.flags, self.serial = type, flags, serial
        self.path, self.interface, self.member = path, interface, member
        self.error_name, self.reply_serial = error_name, reply_serial
        self.destination, self.sender = destination, sender
        self.signature, self.body = signature, body

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__[1:] if getattr(self, k) is not None)
        return f"Message(type={self.type}, {fields})"

    def describe(self) -> str:
        kind = {METHOD_CALL: "call", METHOD_RETURN: "reply", ERROR: "error", SIGNAL: "signal"}.get(self.type, "?")
        name = self.error_name or ".".join(x for x in (self.interface, self.member) if x)
        return f"D-Bus {kind} {name}".rstrip()


def method_call(destination: str | None, path: str, interface: str | None, member: str, signature: str = "",
                body: tuple = ()) -> Message:
    return Message(METHOD_CALL, destination=destination, path=path, interface=interface, member=member,
                   signature=signature, body=body)


def match_rule(**keys: str) -> str:
    """An AddMatch rule: type='signal',sender='...' (a quote inside a value is written '\\'')."""
    return ",".join(f"{k}='" + v.replace("'", "'\\''") + "'" for k, v in keys.items())


def add_match(rule: str) -> Message:
    return method_call(BUS_NAME, BUS_PATH, BUS_NAME, "AddMatch", "s", (rule,))


# code, attribute, signature, check (for the strings)
_FIELDS = ((1, "path", "o", None), (2, "interface", "s", valid_interface), (3, "member", "s", valid_member),
           (4, "error_name", "s", valid_interface), (5, "reply_serial", "u", None),
           (6, "destination", "s", valid_bus_name), (7, "sender", "s", valid_bus_name), (8, "signature", "g", None))
_FIELD_CODES = {f[0]: f for f in _FIELDS}
_REQUIRED = {METHOD_CALL: ("path", "member"), METHOD_RETURN: ("reply_serial",),
             ERROR: ("error_name", "reply_serial"), SIGNAL: ("path", "interface", "member")}
_HEADER = parse_signature("yyyyuua(yv)")
_UNIX_FDS = 9


def _check_fields(msg: Message, where: str) -> None:
    for attr in _REQUIRED.get(msg.type, ()):
        if getattr(msg, attr) is None:
            raise DBusProtocolError(f"{where}: no {attr} header field, which a message of type {msg.type} needs")
    for _code, attr, _sig, check in _FIELDS:
        v = getattr(msg, attr)
        if check is not None and v is not None and not (isinstance(v, str) and check(v)):
            raise DBusProtocolError(f"{where}: header field {attr} {_show(v)} is not a valid name")
    if msg.reply_serial == 0:
        raise DBusProtocolError(f"{where}: reply_serial 0 (serials start at 1)")


def encode_message(msg: Message, serial: int) -> bytes:
    """The bytes of `msg` with `serial` (little-endian); DBusProtocolError names the message and the bad value."""
    where = msg.describe()
    if msg.type not in _REQUIRED or not 0 < serial <= 0xFFFFFFFF:
        raise DBusProtocolError(f"{where}: message type {msg.type} / serial {serial} cannot be sent")
    _check_fields(msg, where)
    try:
        body = encode_values(msg.signature, msg.body)
        fields = [(code, (sig, getattr(msg, attr))) for code, attr, sig, _ in _FIELDS
                  if getattr(msg, attr) is not None and (code != 8 or msg.signature)]
        head = bytearray()
        for node, v in zip(_HEADER, (0x6C, msg.type, msg.flags, 1, len(body), serial, fields)):
            _write(head, node, v, 0)
    except DBusProtocolError as e:
        raise DBusProtocolError(f"{where} (signature {msg.signature!r}): {e}") from None
    _pad(head, 8)
    if len(head) + len(body) > MAX_MESSAGE:
        raise DBusProtocolError(f"{where}: {len(head) + len(body)} bytes, over the 128 MiB message limit")
    head += body
    return bytes(head)


def frame_length(buf: bytes | bytearray) -> int:
    """The length of the message that starts `buf`, from its first 16 bytes (checked against the limits)."""
    if buf[0] == 0x6C:
        fmt = _LE
    elif buf[0] == 0x42:
        fmt = _BE
    else:
        raise DBusProtocolError(f"D-Bus message starting {bytes(buf[:16])!r}: endianness byte not 'l' or 'B'")
    if buf[3] != 1:
        raise DBusProtocolError(f"D-Bus message starting {bytes(buf[:16])!r}: protocol version {buf[3]}, not 1")
    body_len, fields_len = fmt["u"].unpack_from(buf, 4)[0], fmt["u"].unpack_from(buf, 12)[0]
    header = 16 + fields_len
    total = header + (-header % 8) + body_len
    if fields_len > MAX_ARRAY or total > MAX_MESSAGE:
        raise DBusProtocolError(f"D-Bus message of {total} bytes (header fields {fields_len}): over the limits")
    return total


def decode_message(data: bytes) -> Message:
    """One whole message (either byte order), checked: header fields, names, padding, body against signature.
    Bytes that are not one whole message are a DBusProtocolError; a whole message that breaks the rules is an
    UndecodableMessage holding what of its header could be read (the stream around it is still in step)."""
    if len(data) < 16 or frame_length(data) != len(data):
        raise DBusProtocolError(f"D-Bus message of {len(data)} bytes: not one whole message")
    fmt = _LE if data[0] == 0x6C else _BE
    msg = Message(data[1], flags=data[2], serial=fmt["u"].unpack_from(data, 8)[0])
    try:
        _decode_into(msg, data, fmt)
    except DBusProtocolError as e:
        raise UndecodableMessage(str(e), msg) from None
    return msg


def _decode_into(msg: Message, data: bytes, fmt: dict) -> None:
    """Sets msg's header fields (each once its type is checked) and then its body."""
    end, pos, head = len(data), 0, []
    for node in _HEADER:
        v, pos = _read(data, pos, end, node, fmt, 0)
        head.append(v)
    body_len, fields = head[4], head[6]
    where = f"received D-Bus message (type {msg.type}, serial {msg.serial})"
    if msg.serial == 0 or msg.type == 0:
        raise DBusProtocolError(f"{where}: serial and type must not be 0")
    seen = set()
    for code, (sig, value) in fields:
        if code in seen:
            raise DBusProtocolError(f"{where}: header field {code} appears twice")
        seen.add(code)
        if code == _UNIX_FDS and value:
            raise DBusProtocolError(f"{where}: it carries unix fds, which this client never negotiates")
        spec = _FIELD_CODES.get(code)
        if spec is None:
            continue                    # unknown fields are ignored, as the spec says
        if sig != spec[2]:
            raise DBusProtocolError(f"{where}: header field {spec[1]} has type {sig!r}, not {spec[2]!r}")
        setattr(msg, spec[1], value)
    _check_fields(msg, where)
    pos = _skip(data, pos, 8, end, "header")
    if pos + body_len != end:
        raise DBusProtocolError(f"{where}: the body length {body_len} does not match the message")
    try:
        msg.body = decode_values(msg.signature, data[pos:], big_endian=fmt is _BE)
    except DBusProtocolError as e:
        raise DBusProtocolError(f"{where} from {msg.sender}: body: {e}") from None


class Receiver:
    """The byte stream from a peer cut into messages. One bytearray: appends are amortised O(1) and deleting a
    prefix only moves its start, so a message split over many reads costs no quadratic copying."""
    __slots__ = ("buf", "last")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.last = 0           # the size of the message next_message() cut last

    def feed(self, data: bytes) -> None:
        self.buf += data

    def missing(self) -> int:
        """How many more bytes the next message needs (0: it is whole)."""
        if len(self.buf) < 16:
            return 16 - len(self.buf)
        return max(frame_length(self.buf) - len(self.buf), 0)

    def next_message(self) -> Message | None:
        buf = self.buf
        if len(buf) < 16:
            return None
        n = frame_length(buf)
        if len(buf) < n:
            return None
        data = bytes(buf[:n])
        del buf[:n]
        self.last = n
        return decode_message(data)

    def take_line(self) -> bytes | None:
        """A SASL line without its CRLF, or None until one is whole."""
        i = self.buf.find(b"\r\n")
        if i < 0:
            if len(self.buf) > MAX_LINE:
                raise DBusProtocolError(f"D-Bus authentication: a line longer than {MAX_LINE} bytes")
            return None
        line = bytes(self.buf[:i])
        del self.buf[:i + 2]
        return line


# --- addresses ----------------------------------------------------------------------------------------------
_PLAIN = _NAME_CHARS | set("-/\\*.")    # what libdbus takes unescaped in an address value
_HEX = frozenset("0123456789abcdefABCDEF")


def _address_error(address: str, reason: str) -> DBusAddressError:
    return DBusAddressError(f"D-Bus address {address!r}: {reason}")


def _unescape(value: str, address: str) -> bytes:
    out, i = bytearray(), 0
    while i < len(value):
        c = value[i]
        if c == "%":
            digits = value[i + 1:i + 3]
            if len(digits) != 2 or not set(digits) <= _HEX:
                raise _address_error(address, f"bad escape {value[i:i + 3]!r}: % takes two hex digits")
            out.append(int(digits, 16))
            i += 3
        elif c in _PLAIN:
            out.append(ord(c))
            i += 1
        else:
            raise _address_error(address, f"{c!r} must be %-escaped")
    return bytes(out)


def parse_address(address: str) -> list[tuple[str, str, dict[str, bytes]]]:
    """Every `transport:key=value,...` of a `;`-separated address as (its text, transport, decoded values)."""
    out = []
    for entry in address.split(";"):
        if not entry:
            continue
        transport, colon, rest = entry.partition(":")
        if not colon or not transport:
            raise _address_error(address, f"{entry!r} does not start with a transport name and ':'")
        keys: dict[str, bytes] = {}
        for pair in rest.split(",") if rest else ():
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise _address_error(address, f"{pair!r} is not key=value")
            if key in keys:
                raise _address_error(address, f"{key!r} is given twice in {entry!r}")
            keys[key] = _unescape(value, address)
        out.append((entry, transport, keys))
    if not out:
        raise _address_error(address, "no address in it")
    return out


def unix_sockets(address: str) -> list[tuple[str, bytes]]:
    """The sockets to try, in order, as (address text, socket address): unix:path= and unix:abstract= only."""
    out = []
    for entry, transport, keys in parse_address(address):
        if transport != "unix":
            continue
        path, abstract = keys.get("path"), keys.get("abstract")
        if path is not None and abstract is not None:
            raise _address_error(address, f"{entry!r} has both path= and abstract=")
        if path is not None:
            if not path:
                raise _address_error(address, f"{entry!r} has an empty path")
            out.append((entry, path))
        elif abstract is not None:
            out.append((entry, b"\0" + abstract))
    if not out:
        raise _address_error(address, "no unix:path= or unix:abstract= entry (the only transports husk speaks)")
    return out


# --- connections --------------------------------------------------------------------------------------------
class Connection:
    """One authenticated connection to a bus (unique_name set by Hello) or to a peer (unique_name None).
    Every wait takes a deadline on time.monotonic(); a failure part-way through a message, or bytes that cannot be
    cut into messages, end the connection; a whole message that cannot be read is dropped (see wait_reply)."""

    def __init__(self, sock: _socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address
        self.unique_name: str | None = None
        self._serial = 0
        self._rx = Receiver()
        # Signals that arrived while a call waited for its reply, with their sizes, from _held[_head] on: a list
        # and a head index (no collections.deque: its import is what this module avoids), bounded by MAX_HELD.
        self._held: list[tuple[Message, int]] = []
        self._head = 0
        self._held_bytes = 0
        self._overflow = 0                  # signals dropped from the full backlog
        self._broken = ""
        self._drops = 0                     # messages that could not be read

    def close(self) -> None:
        self._broken = self._broken or "closed"
        self.sock.close()

    def next_serial(self) -> int:
        self._serial = self._serial % 0xFFFFFFFF + 1
        return self._serial

    def send(self, msg: Message, deadline: float) -> int:
        """Sends `msg` with the next serial, which it returns (and sets on msg)."""
        serial = self.next_serial()
        data = encode_message(msg, serial)
        msg.serial = serial
        self.send_bytes(data, deadline)
        return serial

    def send_bytes(self, data: bytes, deadline: float) -> None:
        left = self._arm(deadline, "no time left to send")
        try:
            self.sock.sendall(data, _socket.MSG_NOSIGNAL)
        except TimeoutError:
            self._broken = "a send timed out part-way"
            raise TimeoutError(f"D-Bus {self.address}: the peer took no more of {len(data)} bytes "
                               f"within {left:.1f} s") from None
        except OSError as e:
            self._broken = f"a send failed ({e})"
            raise

    def receive(self, deadline: float) -> Message:
        """The next message: first the signals call() held back, oldest first. One that cannot be read is dropped.
        TimeoutError once `deadline` has passed, even while signals are held: a flood must not outlast it."""
        if self._head < len(self._held):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"D-Bus {self.address}: the deadline passed ({self.held_signals()} signals held)")
            return self._take()
        while True:
            msg, bad = self._next(deadline)
            if bad is None:
                return msg
            self._dropped(bad)

    def held_signals(self) -> int:
        """How many signals call() has held back for receive()."""
        return len(self._held) - self._head

    def call(self, msg: Message, deadline: float, reply_from: str | tuple[str, ...] | None = None,
             keep: Callable[[Message], bool] | None = None) -> Message:
        """Sends `msg` and returns its reply (a method return or an error), taking only one whose sender is
        `reply_from` (or one of them) when given. Signals that come first are held for receive() if
        `keep(signal)` (all without `keep`), up to MAX_HELD of them; anything else is dropped."""
        serial = self.send(msg, deadline)
        return self.wait_reply(serial, deadline, reply_from, keep)

    def wait_reply(self, serial: int, deadline: float, reply_from: str | tuple[str, ...] | None = None,
                   keep: Callable[[Message], bool] | None = None) -> Message:
        """The reply to `serial` (see call()). Only a reply that cannot be read fails the wait (UndecodableMessage):
        anyone on a bus can send us a message we cannot read, which is dropped."""
        senders = (reply_from,) if isinstance(reply_from, str) else reply_from
        while True:
            m, bad = self._next(deadline)
            if (m.type in (METHOD_RETURN, ERROR) and m.reply_serial == serial
                    and (senders is None or m.sender in senders)):
                if bad is not None:
                    raise bad
                return m
            if bad is not None:
                self._dropped(bad)
            elif m.type == SIGNAL and (keep is None or keep(m)):
                self._hold(m, self._rx.last)

    def _hold(self, msg: Message, size: int) -> None:
        held = self._held
        held.append((msg, size))
        self._held_bytes += size
        while len(held) - self._head > MAX_HELD or (self._held_bytes > MAX_HELD_BYTES and
                                                   len(held) - self._head > 1):
            self._held_bytes -= held[self._head][1]
            self._head += 1
            self._overflow += 1
            if self._overflow == 1:
                log.warning("D-Bus %s: over %d signals (or %d MiB) arrived while calls waited for replies: "
                            "dropping the oldest (further drops are not logged)", self.address, MAX_HELD,
                            MAX_HELD_BYTES >> 20)
        self._compact()

    def _take(self) -> Message:
        msg, size = self._held[self._head]
        self._head += 1
        self._held_bytes -= size
        self._compact()
        return msg

    def _compact(self) -> None:
        """Forgets the taken and dropped entries, every 1024 (each entry is moved a few times at most)."""
        if self._head == len(self._held):
            self._held.clear()
            self._head = 0
        elif self._head >= 1024:
            del self._held[:self._head]
            self._head = 0

    def read_line(self, deadline: float) -> bytes:
        while True:
            line = self._rx.take_line()
            if line is not None:
                return line
            self._fill(deadline)

    def _next(self, deadline: float) -> tuple[Message, UndecodableMessage | None]:
        """The next whole message, and None; or, for a message that cannot be read, what of it could be and why.
        Only bytes that cannot be cut into messages end the connection: after them the stream is lost."""
        self._usable()
        while True:
            if time.monotonic() >= deadline:    # whole messages may keep coming without a wait on the socket
                raise TimeoutError(f"D-Bus {self.address}: the deadline passed before what was awaited arrived")
            try:
                msg = self._rx.next_message()
                want = self._rx.missing() if msg is None else 0
            except UndecodableMessage as e:
                return e.message, e
            except DBusProtocolError as e:
                self._broken = str(e)
                raise
            if msg is not None:
                return msg, None
            self._fill(deadline, want)

    def _dropped(self, bad: UndecodableMessage) -> None:
        self._drops += 1
        if self._drops <= _LOGGED_DROPS:
            log.debug("D-Bus %s: dropped a message that cannot be read: %s%s", self.address, bad,
                      " (further ones are not logged)" if self._drops == _LOGGED_DROPS else "")

    def _fill(self, deadline: float, want: int = 0) -> None:
        left = self._arm(deadline, "nothing received in time")
        try:
            data = self.sock.recv(min(max(want, 65536), _RECV_MAX))
        except TimeoutError:
            raise TimeoutError(f"D-Bus {self.address}: nothing received within {left:.1f} s") from None
        if not data:
            self._broken = "the peer closed the connection"
            raise ConnectionClosed(f"D-Bus {self.address}: the peer closed the connection")
        self._rx.feed(data)

    def _arm(self, deadline: float, late: str) -> float:
        """Before a send or receive: the connection must be usable and time left (TimeoutError `late` if none);
        the socket's timeout is set to what is left, which is returned."""
        self._usable()
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"D-Bus {self.address}: {late}")
        self.sock.settimeout(left)
        return left

    def _usable(self) -> None:
        if self._broken:
            raise ConnectionClosed(f"D-Bus {self.address}: the connection is unusable: {self._broken}")


def _authenticate(conn: Connection, deadline: float, then: bytes = b"") -> None:
    """SASL EXTERNAL as our effective uid (the server compares it with SO_PEERCRED); BEGIN goes out with `then`."""
    uid = os.geteuid()
    conn.send_bytes(b"\0AUTH EXTERNAL " + str(uid).encode().hex().encode() + b"\r\n", deadline)
    line = conn.read_line(deadline)
    verb, _, rest = line.partition(b" ")
    if verb == b"OK":
        conn.send_bytes(b"BEGIN\r\n" + then, deadline)
        return
    text = rest.decode("ascii", "replace")
    if verb in (b"REJECTED", b"ERROR"):
        raise DBusAuthError(f"D-Bus {conn.address}: AUTH EXTERNAL as uid {uid} refused ({verb.decode()} {text})")
    raise DBusProtocolError(f"D-Bus {conn.address}: unexpected answer to AUTH EXTERNAL: {_show(line)}")


def _open(address: str, deadline: float) -> Connection:
    """A socket connected to the first of `address`'s unix sockets that accepts (OSError naming each that did not)."""
    failures: list[str] = []
    errno = 0
    for entry, sockaddr in unix_sockets(address):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"D-Bus {address}: no time left to connect ({'; '.join(failures)})")
        try:
            sock = _connect(sockaddr, left)
        except OSError as e:
            failures.append(f"{entry}: {e.strerror or e}")
            errno = errno or e.errno or 0
            continue
        return Connection(sock, entry)
    raise OSError(errno, "; ".join(failures))


def _connect(sockaddr: str | bytes, timeout: float) -> _socket.socket:
    """A unix stream socket (close-on-exec) connected to `sockaddr` within `timeout`; closed again on failure."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


def open_bus(address: str, timeout: float) -> Connection:
    """A connection to the bus at `address` (the first of its sockets that accepts), authenticated, with its
    unique name from Hello: connect, auth and Hello share one deadline. OSError (TimeoutError included) when the
    bus cannot be reached or stops answering; DBusAddressError / DBusAuthError / DBusProtocolError otherwise."""
    deadline = time.monotonic() + timeout
    conn = _open(address, deadline)
    try:
        hello = method_call(BUS_NAME, BUS_PATH, BUS_NAME, "Hello")
        serial = conn.next_serial()
        _authenticate(conn, deadline, then=encode_message(hello, serial))
        reply = conn.wait_reply(serial, deadline, BUS_NAME)
        if reply.type == ERROR:
            raise DBusError(f"D-Bus {conn.address}: Hello", reply.error_name or "", error_text(reply))
        name = reply.body[0] if reply.signature == "s" else None
        if not isinstance(name, str) or name[:1] != ":" or not valid_bus_name(name):
            raise DBusProtocolError(f"D-Bus {conn.address}: Hello returned {_show(reply.body)}, not a unique name")
        conn.unique_name = name
    except BaseException:
        conn.close()
        raise
    return conn


def open_peer(path: str, timeout: float) -> Connection:
    """A peer-to-peer connection to the unix socket at `path` (no bus: no Hello), authenticated in `timeout`."""
    deadline = time.monotonic() + timeout
    conn = Connection(_connect(path, timeout), f"unix:path={path}")
    try:
        _authenticate(conn, deadline)
    except BaseException:
        conn.close()
        raise
    return conn


def error_text(reply: Message) -> str:
    """The message of an error reply (its first argument when that is a string), else ""."""
    return reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
