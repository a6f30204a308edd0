"""The protobuf codec, the generated classes (up to date, and field tables equal to protoc's reading of
the .proto files), and decoding of malformed input."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from shim import protobuf as pb
from shim.pb import cgroups_v1, events, google, task, ttrpc, types

TOP = pathlib.Path(__file__).resolve().parents[2]
PROTOS = TOP / "shim" / "protos"


def test_generated_code_is_up_to_date():
    r = subprocess.run([sys.executable, str(TOP / "scripts" / "gen-shim-proto"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_generated_fields_match_protoc_descriptors(tmp_path):
    grpc_tools = pytest.importorskip("grpc_tools")
    from grpc_tools import protoc
    from google.protobuf import descriptor_pb2

    out = tmp_path / "set.pb"
    files = sorted(p.name for p in PROTOS.glob("*.proto"))
    rc = protoc.main(["protoc", f"-I{PROTOS}", f"--descriptor_set_out={out}", *files])
    assert rc == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    kinds = {
        descriptor_pb2.FieldDescriptorProto.TYPE_STRING: pb.STRING,
        descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: pb.BYTES,
        descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: pb.BOOL,
        descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: pb.UINT32,
        descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: pb.UINT64,
        descriptor_pb2.FieldDescriptorProto.TYPE_INT32: pb.INT32,
        descriptor_pb2.FieldDescriptorProto.TYPE_INT64: pb.INT64,
        descriptor_pb2.FieldDescriptorProto.TYPE_ENUM: pb.ENUM,
        descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: pb.DOUBLE,
        descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE: pb.MESSAGE,
    }
    import importlib
    checked = 0
    for fd in fds.file:
        mod = importlib.import_module(f"shim.pb.{pathlib.Path(fd.name).stem}")
        for m in fd.message_type:
            cls = getattr(mod, m.name)
            assert cls.FULL_NAME == f"{fd.package}.{m.name}"
            ours = {f.number: f for f in cls.FIELDS}
            assert set(ours) == {f.number for f in m.field}, cls.FULL_NAME
            for f in m.field:
                mine = ours[f.number]
                assert mine.name == f.name
                if f.type == f.TYPE_MESSAGE and f.type_name.startswith(f".{fd.package}.{m.name}."):
                    assert mine.kind == pb.MAP
                    continue
                assert mine.kind == kinds[f.type], f"{cls.FULL_NAME}.{f.name}"
                assert mine.repeated == (f.label == f.LABEL_REPEATED), f"{cls.FULL_NAME}.{f.name}"
                if f.type == f.TYPE_MESSAGE:
                    assert "." + mine.type_name == f.type_name
                checked += 1
        for s in fd.service:
            for meth in s.method:
                req, resp = mod.SERVICES[f"{fd.package}.{s.name}"][meth.name]
                assert ("." + req, "." + resp) == (meth.input_type, meth.output_type)
    assert checked > 150


def test_roundtrip_every_kind():
    m = task.StateResponse(id="c", bundle="/b", pid=7, status=3, terminal=True, exit_status=137,
                           exited_at=google.Timestamp(seconds=1700000000, nanos=5), exec_id="e")
    assert task.StateResponse.decode(m.encode()) == m
    ts = google.Timestamp(seconds=-5, nanos=-1)
    assert google.Timestamp.decode(ts.encode()) == ts
    u = task.UpdateTaskRequest(id="x", annotations={"a": "1", "b": ""},
                               resources=google.Any(type_url="t", value=b"\x00\x01"))
    assert task.UpdateTaskRequest.decode(u.encode()) == u
    c = cgroups_v1.Metrics(cpu=cgroups_v1.CPUStat(usage=cgroups_v1.CPUUsage(total=1 << 40, per_cpu=[1, 2])))
    assert cgroups_v1.Metrics.decode(c.encode()) == c


def test_known_wire_bytes():
    # Cross-checked by hand against the protobuf encoding rules.
    assert task.KillRequest(id="a", signal=9, all=True).encode() == b"\x0a\x01a\x18\x09\x20\x01"
    assert task.CreateTaskResponse(pid=300).encode() == b"\x08\xac\x02"
    assert google.Empty().encode() == b""
    assert google.Timestamp(seconds=-1).encode() == b"\x08" + b"\xff" * 9 + b"\x01"


def test_defaults_not_encoded_and_unknown_fields_skipped():
    assert task.StartRequest(id="", exec_id="").encode() == b""
    data = events.TaskExit(container_id="c", pid=1, exit_status=2).encode()
    # an unknown varint field 15, fixed64 field 16, fixed32 field 17 and length field 18 are skipped
    extra = b"\x78\x01" + b"\x81\x01" + b"\0" * 8 + b"\x8d\x01" + b"\0" * 4 + b"\x92\x01\x02hi"
    assert events.TaskExit.decode(data + extra) == events.TaskExit(container_id="c", pid=1, exit_status=2)


def test_packed_and_unpacked_repeated():
    unpacked = b"\x20\x01\x20\x02"
    assert cgroups_v1.CPUUsage.decode(unpacked).per_cpu == [1, 2]
    assert cgroups_v1.CPUUsage(per_cpu=[1, 2]).encode() == b"\x22\x02\x01\x02"


@pytest.mark.parametrize("data", [
    b"\x0a",                      # length missing
    b"\x0a\x05ab",                # length past the end
    b"\x08",                      # varint missing
    b"\x08" + b"\xff" * 11,       # varint too long
    b"\x0b",                      # group wire type
    b"\x00\x01",                  # field number 0
    b"\x0a\x02\xc3\x28",          # invalid UTF-8 in a string
    b"\x1a\x03\x0a\x01",          # nested Mount truncated
    b"\x21" + b"\0" * 3,          # fixed64 truncated
    b"\x0d\0",                    # fixed32 truncated
])
def test_malformed_input_raises_decode_error(data):
    with pytest.raises(pb.DecodeError):
        task.CreateTaskRequest.decode(data)


def test_wrong_wire_type_for_field():
    with pytest.raises(pb.DecodeError):
        task.CreateTaskRequest.decode(b"\x08\x01")       # varint for string field 1
    with pytest.raises(pb.DecodeError):
        task.KillRequest.decode(b"\x1a\x01x")            # bytes for the non-repeated uint32 signal


def test_deep_nesting_rejected():
    data = b""
    for _ in range(pb.MAX_DEPTH + 5):
        data = b"\x0a" + pb.encode_varint(len(data)) + data
    with pytest.raises(pb.DecodeError):
        _Nest.decode(data)


class _Nest(pb.Message):
    __slots__ = ("child",)
    FULL_NAME = "test.Nest"
    FIELDS = (pb.Field(1, "child", pb.MESSAGE, "test.Nest"),)


def test_unknown_keyword_rejected():
    with pytest.raises(TypeError):
        types.Mount(nope=1)
    assert ttrpc.Request(service="s").service == "s"
