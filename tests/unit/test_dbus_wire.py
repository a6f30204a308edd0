"""runtime/linux/dbus.py, husk's own D-Bus client, against jeepney as the independent reference: marshalling both
ways over every type code (and big-endian input), whole messages, framing over a real socket (cut at every byte,
several per read, over 64 kB, closed peer, receive and send timeouts), value checks, addresses, SASL and Hello."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.linux import dbus
from tests.support.dbusd import throwaway_bus
from tests.support.unixpeer import flooding, serve_one

jeepney = pytest.importorskip("jeepney")
from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call, new_signal  # noqa: E402
from jeepney.low_level import Endianness, Parser  # noqa: E402
from jeepney.low_level import parse_signature as j_parse_signature  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (signature, values): every type code, their alignments side by side, nesting, empty arrays, dicts, variants
CASES: list[tuple[str, tuple[Any, ...]]] = [
    ("y", (0,)), ("y", (255,)), ("b", (True,)), ("b", (False,)), ("n", (-32768,)), ("n", (32767,)),
    ("q", (65535,)), ("i", (-2**31,)), ("i", (2**31 - 1,)), ("u", (2**32 - 1,)), ("x", (-2**63,)),
    ("x", (2**63 - 1,)), ("t", (2**64 - 1,)), ("d", (3.5,)), ("d", (-1e300,)),
    ("s", ("",)), ("s", ("héllo ✓ \U0001f600",)), ("o", ("/",)), ("o", ("/org/freedesktop/systemd1/job/42",)),
    ("g", ("",)), ("g", ("a{sv}(ii)aay",)),
    ("ybnqiuxtd", (1, True, -2, 3, -4, 5, -6, 7, 0.25)),
    ("ytyqyd", (1, 2, 3, 4, 5, 6.0)),
    ("ay", (b"",)), ("ay", (b"\x00\xff" * 3,)), ("at", ([],)), ("yat", (1, [])), ("yat", (1, [1, 2**64 - 1])),
    ("as", (["a", "", "bc"],)), ("aas", ([[], ["x"], []],)), ("aay", ([b"", b"ab"],)), ("ad", ([0.5, -2.0],)),
    ("ab", ([True, False, True],)), ("ao", (["/a", "/a/b_c/D9"],)), ("ag", (["", "v", "a{sv}"],)),
    ("a{sv}", ({},)), ("ya{sv}", (7, {"a": ("u", 1), "b": ("as", ["x"]), "c": ("v", ("s", "nested"))})),
    ("a{yt}", ({1: 2, 255: 2**64 - 1},)), ("a{ob}", ({"/x": True},)), ("a{s(ai)}", ({"k": ([1, -1],)},)),
    ("a{ia{sd}}", ({1: {"a": 1.5}, 2: {}},)), ("a{bs}", ({True: "t", False: "f"},)),
    ("(i)", ((1,),)), ("(yv)", ((1, ("ay", b"ab")),)), ("y(yt)(q)", (1, (2, 3), (4,))), ("((y)(t))", (((1,), (2,)),)),
    ("v", (("t", 5),)), ("yv", (1, ("t", 5))), ("yvt", (1, ("y", 9), 2)), ("v", (("v", ("v", ("s", "deep"))),)),
    ("v", (("(ybnqiuxtdsog)", (1, False, 2, 3, 4, 5, 6, 7, 8.0, "s", "/o", "g")),)),
    ("v", (("a{sv}", {"x": ("ai", [1, 2])}),)), ("av", ([("y", 1), ("s", "two"), ("at", [3])],)),
    ("aaaaai", ([[[[[1]]], []]],)), ("a(sv)", ([("MemoryMax", ("t", 2**20)), ("PIDs", ("au", [1, 2]))],)),
    ("ssa(sv)a(sa(sv))", ("husk-c1.scope", "replace",
                          [("Delegate", ("b", True)), ("AllowedCPUs", ("ay", b"\x03")), ("Slice", ("s", "a.slice"))],
                          [("aux.service", [("Description", ("s", "x"))])])),
    ("uoss", (42, "/org/freedesktop/systemd1/job/42", "husk-c1.scope", "done")),
]
IDS = [f"{sig}-{i}" for i, (sig, _) in enumerate(CASES)]


def j_serialise(sig: str, values: tuple[Any, ...], endian: Endianness = Endianness.little) -> bytes:
    return j_parse_signature(list(f"({sig})")).serialise(tuple(values), 0, endian)


def j_parse(sig: str, data: bytes) -> tuple[Any, ...]:
    return tuple(j_parse_signature(list(f"({sig})")).parse_data(data, 0, Endianness.little)[0])


# --- marshalling against jeepney --------------------------------------------------------------------------------
@pytest.mark.parametrize("sig, values", CASES, ids=IDS)
def test_encoding_is_byte_for_byte_jeepneys(sig: str, values: tuple[Any, ...]) -> None:
    ours = dbus.encode_values(sig, values)
    assert ours == j_serialise(sig, values)
    assert j_parse(sig, ours) == values


@pytest.mark.parametrize("big", [False, True], ids=["little", "big"])
@pytest.mark.parametrize("sig, values", CASES, ids=IDS)
def test_decoding_jeepneys_bytes_in_either_byte_order(sig: str, values: tuple[Any, ...], big: bool) -> None:
    data = j_serialise(sig, values, Endianness.big if big else Endianness.little)
    decoded = dbus.decode_values(sig, data, big_endian=big)
    assert decoded == values
    assert [type(v) for v in decoded] == [type(v) for v in values]     # bool stays bool, bytes stay bytes


def test_message_bytes_match_jeepney_and_parse_back() -> None:
    j = new_method_call(DBusAddress("/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1",
                                    interface="org.freedesktop.systemd1.Manager"), "StartTransientUnit",
                        CASES[-2][0], CASES[-2][1])
    ours = dbus.method_call("org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                            "org.freedesktop.systemd1.Manager", "StartTransientUnit", CASES[-2][0], CASES[-2][1])
    data = dbus.encode_message(ours, 7)
    assert data == j.serialise(serial=7)
    back = Parser().feed(data)[0]
    assert back.header.serial == 7 and back.header.message_type == MessageType.method_call
    assert back.header.fields[HeaderFields.member] == "StartTransientUnit" and back.body == CASES[-2][1]


@pytest.mark.parametrize("msg, j_type", [
    (dbus.Message(dbus.METHOD_RETURN, reply_serial=3, destination=":1.9", signature="o", body=("/j/1",)),
     MessageType.method_return),
    (dbus.Message(dbus.ERROR, error_name="org.x.Error.Bad", reply_serial=4, signature="s", body=("why",)),
     MessageType.error),
    (dbus.Message(dbus.SIGNAL, path="/s", interface="org.x.I", member="S", sender=":1.1", signature="uoss",
                  body=CASES[-1][1]), MessageType.signal),
    (dbus.Message(dbus.METHOD_CALL, path="/", member="Ping", flags=1), MessageType.method_call),
])
def test_every_message_type_goes_out_as_jeepney_reads_it(msg: dbus.Message, j_type: Any) -> None:
    j = Parser().feed(dbus.encode_message(msg, 11))[0]
    names = {HeaderFields.path: "path", HeaderFields.interface: "interface", HeaderFields.member: "member",
             HeaderFields.error_name: "error_name", HeaderFields.reply_serial: "reply_serial",
             HeaderFields.destination: "destination", HeaderFields.sender: "sender"}
    assert (j.header.message_type, j.header.serial, int(j.header.flags), tuple(j.body)) == (j_type, 11, msg.flags,
                                                                                            msg.body)
    assert {names[k]: v for k, v in j.header.fields.items() if k in names} == {
        a: getattr(msg, a) for a in names.values() if getattr(msg, a) is not None}


@pytest.mark.parametrize("big", [False, True], ids=["little", "big"])
def test_jeepney_messages_decode_with_every_header_field(big: bool) -> None:
    j = new_signal(DBusAddress("/org/freedesktop/systemd1", interface="org.freedesktop.systemd1.Manager"),
                   "JobRemoved", "uoss", CASES[-1][1])
    j.header.fields[HeaderFields.destination] = ":1.42"
    j.header.fields[HeaderFields.sender] = ":1.1"
    if big:
        j.header.endianness = Endianness.big
    m = dbus.decode_message(j.serialise(serial=99))
    assert (m.type, m.serial, m.path, m.interface, m.member) == (
        dbus.SIGNAL, 99, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager", "JobRemoved")
    assert (m.destination, m.sender, m.signature, m.body) == (":1.42", ":1.1", "uoss", CASES[-1][1])
    err = jeepney.new_error(j, "org.freedesktop.systemd1.NoSuchUnit", "s", ("Unit x not loaded.",))
    err.header.fields[HeaderFields.reply_serial] = 5
    e = dbus.decode_message(err.serialise(serial=100))
    assert (e.type, e.error_name, e.reply_serial, dbus.error_text(e)) == (
        dbus.ERROR, "org.freedesktop.systemd1.NoSuchUnit", 5, "Unit x not loaded.")


# --- values that must not go out, bytes that must not be taken -----------------------------------------------------
def test_bool_is_written_as_0_or_1_only() -> None:
    assert dbus.encode_values("bbbb", (True, False, 1, 0)) == bytes([1, 0, 0, 0, 0, 0, 0, 0] * 2)
    for bad in (2, -1, "true", None, 1.0):
        with pytest.raises(dbus.DBusProtocolError, match=r"'b'.*not a bool"):
            dbus.encode_values("b", (bad,))
    with pytest.raises(dbus.DBusProtocolError, match="2 is neither 0 nor 1"):
        dbus.decode_values("b", j_serialise("u", (2,)))      # what jeepney would send for a bool of 2


@pytest.mark.parametrize("code, lo, hi", [("y", 0, 255), ("n", -2**15, 2**15 - 1), ("q", 0, 2**16 - 1),
                                          ("i", -2**31, 2**31 - 1), ("u", 0, 2**32 - 1),
                                          ("x", -2**63, 2**63 - 1), ("t", 0, 2**64 - 1)])
def test_out_of_range_integers_are_protocol_errors_naming_type_and_value(code: str, lo: int, hi: int) -> None:
    dbus.encode_values(code + code, (lo, hi))
    for bad in (lo - 1, hi + 1):
        with pytest.raises(dbus.DBusProtocolError, match=rf"'{code}': {bad} \(int\) is out of range"):
            dbus.encode_values(code, (bad,))
    for bad in ("1", 1.0, True, None):
        with pytest.raises(dbus.DBusProtocolError, match=rf"'{code}'.*not an int"):
            dbus.encode_values(code, (bad,))


@pytest.mark.parametrize("sig, value, reason", [
    ("d", "1.5", "not a float"), ("d", 10**400, "too large for a double"),
    ("s", b"bytes", "not a str"), ("s", 5, "not a str"), ("s", "a\0b", "NUL"), ("s", "\udc80", "surrogate"),
    ("o", "relative/path", "not an object path"), ("o", "/trailing/", "not an object path"),
    ("o", "/a//b", "not an object path"), ("o", "/bad-char", "not an object path"),
    ("g", "a", "ends inside a container"), ("g", "(", "ends inside"), ("g", "()", "empty struct"),
    ("g", "{sv}", "unexpected '{'"), ("g", "a{vs}", "basic type as its key"), ("g", "a{sss}", "exactly a key"),
    ("g", "h", "unix fds"), ("g", "z", "unexpected 'z'"), ("g", "a" * 33 + "y", "arrays nested deeper than 32"),
    ("g", "(" * 33 + "y" + ")" * 33, "structs nested deeper than 32"), ("g", "y" * 256, "over 255"),
    ("as", ("a", "b"), None), ("as", "ab", "not a list"), ("ay", "ab", "not a list or bytes"),
    ("a{sv}", [("a", ("s", "b"))], "not a dict"), ("(ii)", (1,), "not a tuple of 2"), ("(ii)", 1, "not a tuple"),
    ("v", "s", r"not a \(signature, value\) pair"), ("v", ("ss", ("a", "b")), "not one complete type"),
    ("v", ("u", -1), "out of range"), ("v", ("h", 1), "unix fds"), ("a{sv}", {"k": ("t", -1)}, "out of range"),
    ("a{sv}", {1: ("s", "x")}, "not a str"), ("au", [1, 2, -3], "-3"),
])
def test_wrong_values_are_protocol_errors(sig: str, value: Any, reason: str | None) -> None:
    if reason is None:          # a tuple is a fine array: the negative control of the table
        assert dbus.encode_values(sig, (value,)) == j_serialise(sig, (list(value),))
        return
    with pytest.raises(dbus.DBusProtocolError, match=reason):
        dbus.encode_values(sig, (value,))


def test_nesting_and_size_limits() -> None:
    value: Any = ("y", 1)
    for _ in range(70):
        value = ("v", value)
    with pytest.raises(dbus.DBusProtocolError, match="nested deeper than 64"):
        dbus.encode_values("v", (value,))
    deep = j_serialise("v", (value,))     # jeepney writes it; we refuse to read it (no RecursionError)
    with pytest.raises(dbus.DBusProtocolError, match="nested deeper than 64"):
        dbus.decode_values("v", deep)
    with pytest.raises(dbus.DBusProtocolError, match="over the 64 MiB limit"):
        dbus.encode_values("ay", (bytes((1 << 26) + 1),))
    with pytest.raises(dbus.DBusProtocolError, match="2 values expected"):
        dbus.encode_values("ss", ("a",))


def test_unix_fds_are_read_as_their_index_and_never_written() -> None:
    """A bus forwards a body of type 'h' without fds (the index points at none): read as the u32 it is."""
    assert dbus.decode_values("h", j_serialise("u", (3,))) == (3,)
    assert dbus.decode_values("yah", j_serialise("yau", (1, [0, 7]))) == (1, [0, 7])
    assert dbus.decode_values("a{hs}", j_serialise("a{us}", ({5: "x"},))) == ({5: "x"},)
    assert dbus.decode_values("g", b"\x01h\x00") == ("h",)
    for sig, values in (("h", (0,)), ("ah", ([],)), ("(yh)", ((1, 2),)), ("v", (("h", 0),)), ("g", ("h",))):
        with pytest.raises(dbus.DBusProtocolError, match=r"unix fds \(type 'h'\) are not sent"):
            dbus.encode_values(sig, values)


def _nest(inner: Any, levels: int) -> Any:
    """The value of "a(" * levels + (inner's type) + ")" * levels: each array holds one struct."""
    for _ in range(levels):
        inner = [(inner,)]
    return inner


@pytest.mark.parametrize("sig", [
    "a{sa(" * 17 + "y" + ")}" * 17,                         # 17 dict entries and 17 structs, alternately
    "(" * 32 + "a{s" * 32 + "y" + "}" * 32 + ")" * 32,     # 32 structs, 32 dict entries, 32 arrays
    "a(" * 32 + "ay" + ")" * 32,                            # 33 arrays, never two in a row
    "a" * 32 + "(" + "a" * 32 + "y)",                       # 64 arrays, 32 in a row at most
], ids=["17-dicts-17-structs", "32-structs-32-dicts", "33-arrays-apart", "64-arrays-32-in-a-row"])
def test_signatures_nest_as_libdbus_counts(sig: str) -> None:
    """libdbus (dbus-marshal-validate.c, what dbus-daemon checks before it forwards a message) counts array codes
    in a row, structs and dict entries each on their own, 32 of each; husk counted a dict as an array and a
    struct, and every array, so a bus forwarded messages husk refused."""
    assert len(dbus.parse_signature(sig)) == 1
    if sig[0] == "a":                                       # an empty outer array both ways, as jeepney writes it
        empty = {} if sig[1] == "{" else []
        data = dbus.encode_values(sig, (empty,))
        assert data == j_serialise(sig, (empty,)) and dbus.decode_values(sig, data) == (empty,)


@pytest.mark.parametrize("sig, reason", [
    ("a" * 33 + "y", "arrays nested deeper than 32"), ("(" * 33 + "y" + ")" * 33, "structs nested deeper than 32"),
    ("a{s" * 33 + "y" + "}" * 33, "dict entries nested deeper than 32"),
    ("(a" * 32 + "(y)" + ")" * 32, "structs nested deeper than 32"),
], ids=["33-arrays", "33-structs", "33-dicts", "33-structs-apart"])
def test_signatures_nested_deeper_than_libdbus_takes_are_refused(sig: str, reason: str) -> None:
    with pytest.raises(dbus.DBusProtocolError, match=reason):
        dbus.parse_signature(sig)


def test_values_nest_64_deep_as_libdbus_counts() -> None:
    """At most 64 containers around a value that is read: the bytes of an array at depth 64 are not (libdbus does
    not look into an array of numbers), the structs of one are; a dict's keys and values are two deeper."""
    sig = "a(" * 32 + "ay" + ")" * 32
    value = _nest(b"x", 32)
    assert dbus.decode_values(sig, j_serialise(sig, (value,))) == (value,)
    sig = "a(" * 32 + "as" + ")" * 32
    assert dbus.decode_values(sig, j_serialise(sig, (_nest([], 32),))) == (_nest([], 32),)
    with pytest.raises(dbus.DBusProtocolError, match="nested deeper than 64"):
        dbus.decode_values(sig, j_serialise(sig, (_nest(["x"], 32),)))
    sig = "a(" * 31 + "a{yy}" + ")" * 31                   # the dict at depth 62: its entries' values at 64
    value = _nest({1: 2}, 31)
    assert dbus.decode_values(sig, j_serialise(sig, (value,))) == (value,)
    sig = "a(" * 31 + "aa{yy}" + ")" * 31                  # at depth 63: its values at 65
    with pytest.raises(dbus.DBusProtocolError, match="nested deeper than 64"):
        dbus.decode_values(sig, j_serialise(sig, (_nest([{1: 2}], 31),)))
    assert dbus.decode_values(sig, j_serialise(sig, (_nest([{}], 31),))) == (_nest([{}], 31),)


@pytest.mark.parametrize("sig, data, reason", [
    ("u", b"\x01\x00", "ends before the value"),
    ("yu", b"\x01\x01\x00\x00\x05\x00\x00\x00", "padding that is not zero"),
    ("s", b"\x02\x00\x00\x00ab", "ends before"),
    ("s", b"\x02\x00\x00\x00abX", "NUL-terminated"), ("s", b"\x03\x00\x00\x00a\x00b\x00", "without NULs"),
    ("s", b"\x02\x00\x00\x00\xff\xfe\x00", "not valid UTF-8"), ("o", b"\x01\x00\x00\x00x\x00", "not an object path"),
    ("g", b"\x01z\x00", "unexpected 'z'"), ("v", b"\x02ss\x00", "not one complete type"),
    ("au", b"\x08\x00\x00\x00\x01\x00\x00\x00", "runs past"),
    ("au", b"\x06\x00\x00\x00\x01\x00\x00\x00\x02\x00", "ends before"),      # an element cut by the length
    ("ay", b"\x01\x00\x00\x04", "over the 64 MiB limit"),
    ("u", b"\x01\x00\x00\x00\x00", "1 bytes left after"),
])
def test_malformed_input_is_a_protocol_error(sig: str, data: bytes, reason: str) -> None:
    with pytest.raises(dbus.DBusProtocolError, match=reason):
        dbus.decode_values(sig, data)


def _raw_message(fields: list[tuple[int, tuple[str, Any]]], body: bytes = b"", mtype: int = 4, serial: int = 1,
                 endian: bytes = b"l", version: int = 1) -> bytes:
    head = j_serialise("yyyyuua(yv)", (endian[0], mtype, 0, version, len(body), serial, fields))
    return head + bytes(-len(head) % 8) + body


SIGNAL_FIELDS = [(1, ("o", "/a")), (2, ("s", "a.b")), (3, ("s", "M"))]


@pytest.mark.parametrize("data, reason", [
    (_raw_message(SIGNAL_FIELDS, serial=0), "serial and type must not be 0"),
    (_raw_message(SIGNAL_FIELDS[:2]), "no member header field"),
    (_raw_message(SIGNAL_FIELDS + [(3, ("s", "N"))]), "appears twice"),
    (_raw_message(SIGNAL_FIELDS + [(5, ("s", "1"))]), "reply_serial has type 's'"),
    (_raw_message(SIGNAL_FIELDS + [(6, ("s", "no dots"))]), "destination 'no dots' is not a valid name"),
    (_raw_message([(1, ("o", "/a")), (2, ("s", "nodot")), (3, ("s", "M"))]), "interface 'nodot'"),
    (_raw_message(SIGNAL_FIELDS + [(9, ("u", 1))]), "unix fds"),
    (_raw_message(SIGNAL_FIELDS + [(8, ("g", "u"))], b"\x01\x00"), "ends before"),
    (_raw_message(SIGNAL_FIELDS, b"\x01\x00\x00\x00"), "4 bytes left"),       # a body without a signature
    (_raw_message(SIGNAL_FIELDS, endian=b"X"), "endianness byte"),
    (_raw_message(SIGNAL_FIELDS, version=2), "protocol version 2"),
])
def test_malformed_messages_are_protocol_errors(data: bytes, reason: str) -> None:
    with pytest.raises(dbus.DBusProtocolError, match=reason):
        dbus.decode_message(data)


def test_unknown_header_fields_are_ignored_and_names_checked_when_sending() -> None:
    m = dbus.decode_message(_raw_message(SIGNAL_FIELDS + [(200, ("as", ["future"]))]))
    assert (m.path, m.interface, m.member) == ("/a", "a.b", "M")
    for kw, reason in ((dict(member="1x"), "member '1x'"), (dict(interface="a"), "interface 'a'"),
                       (dict(destination="a..b"), "destination"), (dict(path="x"), "not an object path")):
        args = dict(destination="org.x", path="/p", interface="org.x.I", member="M") | kw
        with pytest.raises(dbus.DBusProtocolError, match=reason):
            dbus.encode_message(dbus.method_call(**args), 1)
    with pytest.raises(dbus.DBusProtocolError, match="no member"):
        dbus.encode_message(dbus.Message(dbus.METHOD_CALL, path="/p"), 1)
    with pytest.raises(dbus.DBusProtocolError, match=r"StartTransientUnit \(signature 'st'\).*'t': -1"):
        dbus.encode_message(dbus.method_call("org.x", "/p", "org.x.I", "StartTransientUnit", "st", ("a", -1)), 1)


# --- framing ------------------------------------------------------------------------------------------------------
def _stream() -> tuple[bytes, list[Any]]:
    """Three messages back to back: little-endian, big-endian, and one over 64 kB."""
    small = new_method_call(DBusAddress("/a", bus_name="org.x", interface="org.x.I"), "M", "sa{sv}",
                            ("one", {"k": ("u", 1)}))
    big_endian = new_signal(DBusAddress("/b", interface="org.x.I"), "S", "ayt", (b"\x01\x02", 2**40))
    big_endian.header.endianness = Endianness.big
    large = new_method_call(DBusAddress("/c", bus_name="org.x", interface="org.x.I"), "L", "ay", (os.urandom(70000),))
    msgs = [small, big_endian, large]
    return b"".join(m.serialise(serial=i + 1) for i, m in enumerate(msgs)), msgs


def _same(ours: dbus.Message, j: Any) -> bool:
    return (ours.member == j.header.fields[HeaderFields.member] and ours.path == j.header.fields[HeaderFields.path]
            and ours.body == tuple(j.body))


def test_a_message_cut_at_every_byte_offset() -> None:
    data, msgs = _stream()
    head = data[:-70200]          # the two small ones whole, and the first bytes of the large one
    for cut in range(1, len(head) + 200):
        rx = dbus.Receiver()
        got = []
        for part in (data[:cut], data[cut:]):
            rx.feed(part)
            while (m := rx.next_message()) is not None:
                got.append(m)
        assert len(got) == 3 and all(_same(o, j) for o, j in zip(got, msgs)), cut


def test_a_byte_at_a_time_and_all_at_once() -> None:
    data, msgs = _stream()
    rx = dbus.Receiver()
    got = []
    for i in range(0, len(data)):
        rx.feed(data[i:i + 1])
        if rx.missing() == 0:
            got.append(rx.next_message())
    assert len(got) == 3 and all(_same(o, j) for o, j in zip(got, msgs))
    rx.feed(data)
    assert [_same(rx.next_message(), j) for j in msgs] == [True] * 3 and rx.next_message() is None


def test_a_declared_length_over_the_limit_fails_without_waiting_for_it() -> None:
    rx = dbus.Receiver()
    rx.feed(b"l\x04\x00\x01" + (1 << 27).to_bytes(4, "little") + b"\x01\x00\x00\x00" + bytes(4))
    with pytest.raises(dbus.DBusProtocolError, match="over the limits"):
        rx.next_message()


@pytest.fixture
def pair() -> Iterator[tuple[dbus.Connection, socket.socket]]:
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    import _socket
    sock = _socket.socket(fileno=ours.detach())
    conn = dbus.Connection(sock, "unix:path=/test")
    yield conn, peer
    conn.close()
    peer.close()


def test_several_messages_per_read_and_a_large_one_over_a_socket(pair: tuple[dbus.Connection, socket.socket]) -> None:
    conn, peer = pair
    data, msgs = _stream()
    threading.Thread(target=peer.sendall, args=(data,), daemon=True).start()
    deadline = time.monotonic() + 5
    assert all(_same(conn.receive(deadline), j) for j in msgs)


def test_pieces_with_pauses_between_them(pair: tuple[dbus.Connection, socket.socket]) -> None:
    conn, peer = pair
    data, msgs = _stream()

    def dribble() -> None:
        for cut in (0, 3, 17, 200, 5000, 40000, len(data)):
            peer.sendall(data[dribble.at:cut])    # type: ignore[attr-defined]
            dribble.at = cut                      # type: ignore[attr-defined]
            time.sleep(0.01)
    dribble.at = 0                                # type: ignore[attr-defined]
    threading.Thread(target=dribble, daemon=True).start()
    assert all(_same(conn.receive(time.monotonic() + 5), j) for j in msgs)


def test_receive_timeout_keeps_a_partial_message(pair: tuple[dbus.Connection, socket.socket]) -> None:
    conn, peer = pair
    data, msgs = _stream()
    peer.sendall(data[:10])
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing received"):
        conn.receive(t0 + 0.2)
    assert 0.15 < time.monotonic() - t0 < 2
    peer.sendall(data[10:])
    assert _same(conn.receive(time.monotonic() + 5), msgs[0])


def test_closed_peer_is_an_error(pair: tuple[dbus.Connection, socket.socket]) -> None:
    conn, peer = pair
    data, _ = _stream()
    peer.sendall(data[:30])          # half a message, then gone
    peer.close()
    with pytest.raises(dbus.ConnectionClosed, match="closed the connection"):
        conn.receive(time.monotonic() + 5)
    with pytest.raises(dbus.ConnectionClosed, match="unusable"):
        conn.receive(time.monotonic() + 5)


def test_send_times_out_when_the_peer_stops_reading(pair: tuple[dbus.Connection, socket.socket]) -> None:
    conn, peer = pair
    msg = dbus.method_call("org.x", "/p", "org.x.I", "M", "ay", (bytes(8 << 20),))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="took no more"):
        conn.send(msg, t0 + 0.3)
    assert time.monotonic() - t0 < 3
    with pytest.raises(dbus.ConnectionClosed, match="part-way"):     # half a message went out: the stream is lost
        conn.send(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 1)


def test_call_keeps_signals_and_skips_other_replies(pair: tuple[dbus.Connection, socket.socket]) -> None:
    conn, peer = pair
    sig = new_signal(DBusAddress("/s", interface="org.x.I"), "S", "u", (1,))
    wrong = jeepney.new_method_return(sig, "s", ("not yours",))
    wrong.header.fields[HeaderFields.reply_serial] = 1
    wrong.header.fields[HeaderFields.sender] = ":1.9"
    right = jeepney.new_method_return(sig, "s", ("yours",))
    right.header.fields[HeaderFields.reply_serial] = 1
    right.header.fields[HeaderFields.sender] = "org.x"
    peer.sendall(sig.serialise(serial=5) + wrong.serialise(serial=6) + right.serialise(serial=7))
    reply = conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 5, reply_from="org.x")
    assert reply.body == ("yours",)
    assert conn.receive(time.monotonic() + 5).member == "S"
    call = Parser().feed(peer.recv(4096))[0]
    assert call.header.serial == 1 and call.header.fields[HeaderFields.member] == "M"


BAD_UTF8 = b"\x02\x00\x00\x00\xff\xfe\x00"                   # a body of type 's' that is not UTF-8


def _reply(serial: int, reply_serial: int, sender: str, body: bytes = b"\x03\x00\x00\x00abc\x00") -> bytes:
    return _raw_message([(5, ("u", reply_serial)), (7, ("s", sender)), (8, ("g", "s"))], body, mtype=2, serial=serial)


def test_a_message_that_cannot_be_read_is_dropped_and_the_connection_lives_on(
        pair: tuple[dbus.Connection, socket.socket]) -> None:
    """A whole message was cut from the stream by its length: the stream is in step, and anyone on a bus can send
    us one we cannot read. Only the awaited reply fails its call; bytes that cannot be cut into messages end it."""
    conn, peer = pair
    bad_signal = _raw_message(SIGNAL_FIELDS + [(6, ("s", ":1.42")), (8, ("g", "s"))], BAD_UTF8, serial=5)
    good_signal = _raw_message(SIGNAL_FIELDS + [(8, ("g", "s"))], b"\x02\x00\x00\x00ok\x00", serial=6)
    peer.sendall(bad_signal + _reply(7, 1, ":1.666", BAD_UTF8) + good_signal + _reply(8, 1, "org.x"))
    reply = conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 5, reply_from="org.x")
    assert reply.body == ("abc",)
    assert conn.receive(time.monotonic() + 5).body == ("ok",)         # the unreadable signal was dropped
    peer.sendall(bad_signal + _reply(9, 2, "org.x", BAD_UTF8))
    with pytest.raises(dbus.UndecodableMessage, match="serial 9.*not valid UTF-8") as err:
        conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 5, reply_from="org.x")
    assert (err.value.message.reply_serial, err.value.message.sender) == (2, "org.x")
    peer.sendall(bad_signal + _reply(10, 3, "org.x"))
    assert conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 5, "org.x").body == ("abc",)
    peer.sendall(bad_signal + b"X" * 16)
    with pytest.raises(dbus.DBusProtocolError, match="endianness byte"):
        conn.receive(time.monotonic() + 5)
    with pytest.raises(dbus.ConnectionClosed, match="unusable.*endianness"):
        conn.receive(time.monotonic() + 5)


def _signals(n: int, member: str = "S") -> bytes:
    """n signals, their body their number."""
    return b"".join(dbus.encode_message(dbus.Message(dbus.SIGNAL, path="/s", interface="org.x.I", member=member,
                                                     signature="u", body=(i,)), i + 1) for i in range(n))


def test_held_signals_are_bounded_oldest_first_and_filtered(pair: tuple[dbus.Connection, socket.socket]) -> None:
    """A call held every signal that came before its reply, without bound: anyone on a bus can send them."""
    conn, peer = pair
    extra = 300
    threading.Thread(target=peer.sendall, args=(_signals(dbus.MAX_HELD + extra) + _reply(1, 1, "org.x"),),
                     daemon=True).start()
    conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 10, "org.x")
    assert conn.held_signals() == dbus.MAX_HELD
    first = conn.receive(time.monotonic() + 5)
    assert first.body == (extra,)                   # the oldest went
    while conn.held_signals():
        last = conn.receive(time.monotonic() + 5)
    assert last.body == (dbus.MAX_HELD + extra - 1,)
    # with `keep`, only what it accepts is held
    peer.sendall(_signals(50) + _signals(1, "Wanted") + _signals(50) + _reply(2, 2, "org.x"))
    conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 5, "org.x",
              keep=lambda m: m.member == "Wanted")
    assert conn.held_signals() == 1 and conn.receive(time.monotonic() + 5).member == "Wanted"


def test_receive_keeps_its_deadline_while_signals_are_held(pair: tuple[dbus.Connection, socket.socket]) -> None:
    """receive() handed out held signals without looking at the clock: a caller's loop over a flood held by a
    call (systemd_dbus.wait_job) ran past its timeout."""
    conn, peer = pair
    peer.sendall(_signals(3) + _reply(4, 1, "org.x"))
    conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), time.monotonic() + 5, "org.x")
    assert conn.held_signals() == 3
    with pytest.raises(TimeoutError, match="deadline passed"):
        conn.receive(time.monotonic() - 0.001)
    assert [conn.receive(time.monotonic() + 5).body for _ in range(3)] == [(0,), (1,), (2,)]


def test_a_flood_does_not_outlast_a_calls_deadline(pair: tuple[dbus.Connection, socket.socket]) -> None:
    """Whole messages already in the buffer were taken without a look at the clock."""
    conn, peer = pair
    with flooding(peer, _signals(2000)):
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            conn.call(dbus.method_call("org.x", "/p", "org.x.I", "M"), t0 + 0.5, "org.x", keep=lambda m: False)
        assert time.monotonic() - t0 < 2.5 and conn.held_signals() == 0


# --- addresses ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("address, sockets", [
    ("unix:path=/run/dbus/system_bus_socket", [b"/run/dbus/system_bus_socket"]),
    ("unix:abstract=/tmp/dbus-X", [b"\0/tmp/dbus-X"]),
    ("unix:path=/a%20b%2c%3b%25,guid=0123", [b"/a b,;%"]),
    ("unix:path=/A%2fb%2F", [b"/A/b/"]),
    ("tcp:host=localhost,port=1;unix:path=/x;unix:abstract=y;", [b"/x", b"\0y"]),
    ("unix:tmpdir=/tmp;unix:path=/z", [b"/z"]),
    ("unix:path=/-_.\\*", [b"/-_.\\*"]),
])
def test_address_parsing(address: str, sockets: list[bytes]) -> None:
    assert [s for _, s in dbus.unix_sockets(address)] == sockets


@pytest.mark.parametrize("address, reason", [
    ("unix:path=/a%zzb", "bad escape '%zz'"), ("unix:path=/a%2", "bad escape '%2'"), ("unix:path=/a%", "bad escape"),
    ("unix:path=/a b", "' ' must be %-escaped"), ("unix:path=/a%20b;unix:path=/c%g0", "bad escape '%g0'"),
    ("nocolon", "transport name"), (":path=/x", "transport name"), ("unix:path", "not key=value"),
    ("unix:=x", "not key=value"), ("unix:path=/a,path=/b", "given twice"), ("unix:path=/a,abstract=b", "both"),
    ("unix:path=", "empty path"), ("tcp:host=x,port=1", "no unix:path="), ("", "no address"), (";", "no address"),
])
def test_bad_addresses_are_errors_naming_the_address(address: str, reason: str) -> None:
    with pytest.raises(dbus.DBusAddressError, match=reason) as err:
        dbus.unix_sockets(address)
    assert repr(address) in str(err.value)


# --- SASL, Hello, AddMatch ----------------------------------------------------------------------------------------
class FakeBus:
    """A listening socket that answers SASL EXTERNAL and Hello as dbus-daemon does (`auth_reply`, delays)."""

    def __init__(self, path: str, auth_reply: bytes = b"OK 0123456789abcdef0123456789abcdef\r\n",
                 auth_delay: float = 0.0, hello_delay: float = 0.0) -> None:
        self.path, self.auth_reply = path, auth_reply
        self.auth_delay, self.hello_delay = auth_delay, hello_delay
        self.received = b""
        self.listener, self.thread = serve_one(path, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        while b"\r\n" not in self.received:
            self.received += conn.recv(4096)
        time.sleep(self.auth_delay)
        conn.sendall(self.auth_reply)
        parser = Parser()
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            self.received += chunk
            if b"BEGIN\r\n" in chunk:
                chunk = chunk.split(b"BEGIN\r\n", 1)[1]
            for msg in parser.feed(chunk):
                if msg.header.fields.get(HeaderFields.member) == "Hello":
                    time.sleep(self.hello_delay)
                    reply = jeepney.new_method_return(msg, "s", (":1.42",))
                    reply.header.fields[HeaderFields.sender] = "org.freedesktop.DBus"
                    try:
                        conn.sendall(reply.serialise(serial=1))
                    except OSError:      # the client gave up waiting
                        return

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


def test_auth_and_hello(tmp_path: Any) -> None:
    bus = FakeBus(f"{tmp_path}/bus")
    conn = dbus.open_bus(f"unix:path={tmp_path}/missing;unix:path={tmp_path}/bus", 5)   # the first that accepts
    try:
        assert conn.unique_name == ":1.42" and conn.address == f"unix:path={tmp_path}/bus"
    finally:
        conn.close()
        bus.close()
    uid_hex = str(os.geteuid()).encode().hex().encode()
    assert bus.received.startswith(b"\0AUTH EXTERNAL " + uid_hex + b"\r\nBEGIN\r\n")


def test_refused_auth_is_an_auth_error(tmp_path: Any) -> None:
    bus = FakeBus(f"{tmp_path}/bus", auth_reply=b"REJECTED EXTERNAL DBUS_COOKIE_SHA1\r\n")
    try:
        with pytest.raises(dbus.DBusAuthError, match="refused.*DBUS_COOKIE_SHA1"):
            dbus.open_bus(f"unix:path={tmp_path}/bus", 5)
    finally:
        bus.close()


def test_connect_auth_and_hello_share_one_deadline(tmp_path: Any) -> None:
    bus = FakeBus(f"{tmp_path}/bus", auth_delay=0.4, hello_delay=0.4)   # each fits in 0.6 s, both do not
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            dbus.open_bus(f"unix:path={tmp_path}/bus", 0.6)
        assert time.monotonic() - t0 < 2      # (per-step deadlines would not raise at all: 0.4 s each)
    finally:
        bus.close()


def test_a_peer_gets_no_hello(tmp_path: Any) -> None:
    bus = FakeBus(f"{tmp_path}/bus")
    conn = dbus.open_peer(f"{tmp_path}/bus", 5)
    conn.close()
    bus.close()
    assert conn.unique_name is None and b"Hello" not in bus.received and bus.received.endswith(b"BEGIN\r\n")


def test_unreachable_bus_is_an_oserror_naming_each_socket(tmp_path: Any) -> None:
    with pytest.raises(OSError, match=r"unix:path=\S*/a: No such file.*unix:abstract=husk-test-none"):
        dbus.open_bus(f"unix:path={tmp_path}/a;unix:abstract=husk-test-none-{os.getpid()}", 1)


def test_match_rule_quotes() -> None:
    assert dbus.match_rule(type="signal", member="it's") == "type='signal',member='it'\\''s'"


@pytest.fixture
def bus_address() -> Iterator[str]:
    with throwaway_bus() as address:
        yield address


def test_a_real_bus_hello_add_match_and_signals(bus_address: str) -> None:
    from jeepney.io.blocking import open_dbus_connection
    conn = dbus.open_bus(bus_address, 5)
    other = open_dbus_connection(bus=bus_address)
    try:
        assert conn.unique_name and conn.unique_name.startswith(":")
        rule = dbus.match_rule(type="signal", interface="org.husk.Test", member="Wanted")
        reply = conn.call(dbus.add_match(rule), time.monotonic() + 5, dbus.BUS_NAME)
        assert reply.type == dbus.METHOD_RETURN
        for member in ("Unwanted", "Wanted"):
            other.send(new_signal(DBusAddress("/org/husk", interface="org.husk.Test"), member, "s", (member,)))
        # No quiet window to wait out: a round trip of `other` with the bus (it has routed other's signals before it
        # answers), then one of ours: whatever the bus sent us by then comes before its reply, held by call()
        other.send_and_get_reply(new_method_call(DBusAddress(dbus.BUS_PATH, bus_name=dbus.BUS_NAME,
                                                             interface=dbus.BUS_NAME), "GetId"), timeout=5)
        conn.call(dbus.method_call(dbus.BUS_NAME, dbus.BUS_PATH, dbus.BUS_NAME, "GetId"), time.monotonic() + 5,
                  dbus.BUS_NAME)
        got = []
        while conn.held_signals():
            got.append(conn.receive(time.monotonic() + 5))
        # the bus's own NameAcquired (sent to us after Hello) and the one broadcast the rule matches
        assert [(m.sender, m.destination, m.member, m.body) for m in got] == [
            (dbus.BUS_NAME, conn.unique_name, "NameAcquired", (conn.unique_name,)),
            (other.unique_name, None, "Wanted", ("Wanted",))]
        bad = conn.call(dbus.method_call(dbus.BUS_NAME, dbus.BUS_PATH, dbus.BUS_NAME, "NoSuchMethod"),
                        time.monotonic() + 5, dbus.BUS_NAME)
        assert bad.type == dbus.ERROR and bad.error_name == "org.freedesktop.DBus.Error.UnknownMethod"
    finally:
        other.close()
        conn.close()


def _unicast_signal(sig: str, body: bytes, to: str) -> bytes:
    """A signal straight to `to`, marshalled by hand: neither husk nor jeepney writes these signatures."""
    return _raw_message([(1, ("o", "/x")), (2, ("s", "a.b")), (3, ("s", "Boom")), (6, ("s", to)), (8, ("g", sig))],
                        body, serial=99)


def test_what_a_real_bus_forwards_does_not_break_the_connection(bus_address: str) -> None:
    """Any local user can send these to husk's connection, and dbus-daemon forwards them: type 'h' without fds,
    and 17 dict entries and 17 structs nested alternately (libdbus counts them apart). Each ended the connection."""
    from jeepney.io.blocking import open_dbus_connection
    conn = dbus.open_bus(bus_address, 5)
    attacker = open_dbus_connection(bus=bus_address)
    try:
        deep = "a{sa(" * 17 + "y" + ")}" * 17
        attacker.sock.sendall(_unicast_signal("h", b"\x00\x00\x00\x00", conn.unique_name)
                              + _unicast_signal(deep, bytes(8), conn.unique_name))
        attacker.send_and_get_reply(new_method_call(DBusAddress(dbus.BUS_PATH, bus_name=dbus.BUS_NAME,
                                                                interface=dbus.BUS_NAME), "GetId"), timeout=5)
        # the bus routed both before it answered the attacker, and so before it answers us
        reply = conn.call(dbus.method_call(dbus.BUS_NAME, dbus.BUS_PATH, dbus.BUS_NAME, "GetId"),
                          time.monotonic() + 5, dbus.BUS_NAME)
        assert reply.type == dbus.METHOD_RETURN and reply.signature == "s"
        got = [conn.receive(time.monotonic() + 5) for _ in range(3)]
        assert [(m.member, m.sender, m.signature, m.body) for m in got] == [
            ("NameAcquired", dbus.BUS_NAME, "s", (conn.unique_name,)),
            ("Boom", attacker.unique_name, "h", (0,)), ("Boom", attacker.unique_name, deep, ({},))]
    finally:
        attacker.close()
        conn.close()


def test_the_module_imports_only_builtins_level_modules() -> None:
    code = ("import sys, os, time; before = set(sys.modules); import runtime.linux.dbus, runtime.cgroups.systemd_dbus; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {TOP!r}); {code}"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert set(out) <= {"__future__", "_socket", "_struct", "runtime", "runtime.errors", "runtime.linux",
                        "runtime.linux.dbus", "runtime.logutil", "runtime.cgroups", "runtime.cgroups.systemd_dbus"}, out
