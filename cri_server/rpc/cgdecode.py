"""Shim stats (io.containerd.cgroups.v1.Metrics) decoded by upb, into shim/pb's classes.

The stats RPCs decode one Metrics per running container and pod per call (kubelet relists stats every few
seconds); shim/protobuf.py's pure-Python codec spent ~0.35 ms on each, most of husk-cri's own CPU under a
relisting kubelet. husk-cri has google.protobuf (upb, in C) loaded anyway for CRI: the message types are
declared to a private descriptor pool from shim/pb/cgroups_v1.py's field tables (one source of truth, nothing
generated), the bytes parsed in C, and only the fields that are set copied into the same objects the pure
codec returns, so every reader of a reading is unchanged. The shim itself never imports this.
"""
from __future__ import annotations

from typing import Any

from shim import protobuf as spb


class Decoder:
    """Decodes `root` (a shim/pb Message class) and the message types of its package it refers to."""

    def __init__(self, root: type[spb.Message]) -> None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        T = descriptor_pb2.FieldDescriptorProto
        types = {spb.STRING: T.TYPE_STRING, spb.BYTES: T.TYPE_BYTES, spb.BOOL: T.TYPE_BOOL,
                 spb.UINT32: T.TYPE_UINT32, spb.UINT64: T.TYPE_UINT64, spb.INT32: T.TYPE_INT32,
                 spb.INT64: T.TYPE_INT64, spb.DOUBLE: T.TYPE_DOUBLE, spb.MESSAGE: T.TYPE_MESSAGE}
        package = root.FULL_NAME.rsplit(".", 1)[0]
        classes: dict[str, type[spb.Message]] = {}
        todo = [root]
        while todo:
            cls = todo.pop()
            if cls.FULL_NAME in classes:
                continue
            classes[cls.FULL_NAME] = cls
            todo.extend(spb.lookup(f.type_name) for f in cls.FIELDS if f.kind == spb.MESSAGE)
        fdp = descriptor_pb2.FileDescriptorProto(name=f"husk-cri/{package}.proto", package=package,
                                                 syntax="proto3")
        for name, cls in classes.items():
            if not name.startswith(package + "."):
                raise ValueError(f"{name}: not in package {package}")
            mp = fdp.message_type.add(name=name[len(package) + 1:])
            for f in cls.FIELDS:
                if f.kind not in types:      # enums and maps: none in the messages this decodes
                    raise ValueError(f"{name}.{f.name}: {f.kind} fields are not supported")
                fp = mp.field.add(name=f.name, number=f.number, type=types[f.kind],
                                  label=T.LABEL_REPEATED if f.repeated else T.LABEL_OPTIONAL)
                if f.kind == spb.MESSAGE:
                    fp.type_name = "." + f.type_name
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(fdp.SerializeToString())
        self._upb = message_factory.GetMessageClass(pool.FindMessageTypeByName(root.FULL_NAME))
        # Per class: field number -> (attribute, the class of a message field or None, repeated).
        self._fields = {cls: {f.number: (f.name, spb.lookup(f.type_name) if f.kind == spb.MESSAGE else None,
                                         f.repeated) for f in cls.FIELDS} for cls in classes.values()}
        self.root = root

    def decode(self, data: bytes) -> Any:
        """The same object `root.decode(data)` returns; ValueError if `data` is not a valid encoding."""
        from google.protobuf.message import DecodeError
        try:
            m = self._upb.FromString(data)
        except DecodeError as e:
            raise ValueError(f"{self.root.FULL_NAME}: {e}") from None
        return self._copy(m, self.root)

    def _copy(self, m: Any, cls: type[spb.Message]) -> Any:
        out = cls()
        fields = self._fields[cls]
        for fd, v in m.ListFields():
            name, sub, repeated = fields[fd.number]
            if sub is not None:
                v = [self._copy(x, sub) for x in v] if repeated else self._copy(v, sub)
            elif repeated:
                v = list(v)
            object.__setattr__(out, name, v)
        return out


_decoders: dict[type, Decoder] = {}


def decode(cls: type[spb.Message], data: bytes) -> Any:
    """`cls.decode(data)` through upb (the decoder for `cls` is built on first use)."""
    d = _decoders.get(cls)
    if d is None:
        d = _decoders[cls] = Decoder(cls)
    return d.decode(data)
