"""Manifest, index and config parsing; platform choice; chain ids; user split and records."""
from __future__ import annotations

import json

import pytest

from cri_server.images import manifest as mf
from cri_server.images.errors import InvalidManifest, PlatformNotFound
from cri_server.images.metadata import ImageRow, NameRow
from cri_server.images.records import build_record, split_user

H = "sha256:" + "1" * 64


def desc(mt: str = mf.OCI_LAYER_GZIP, digest: str = H, size: int = 1, **kw) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return {"mediaType": mt, "digest": digest, "size": size, **kw}


def man(layers=None, config=None, **kw) -> bytes:  # type: ignore[no-untyped-def]
    return json.dumps({"schemaVersion": 2, "mediaType": mf.OCI_MANIFEST,
                       "config": config or desc(mf.OCI_CONFIG), "layers": layers or [desc()], **kw}).encode()


def test_parse_manifest_and_detect():
    data = man()
    assert mf.detect_media_type(data, None, "m") == mf.OCI_MANIFEST
    m = mf.parse_manifest(data, mf.OCI_MANIFEST)
    assert m.config.media_type == mf.OCI_CONFIG and len(m.layers) == 1
    bare = json.dumps({"schemaVersion": 2, "config": desc(mf.DOCKER_CONFIG), "layers": []}).encode()
    assert mf.detect_media_type(bare, "application/vnd.docker.distribution.manifest.v2+json; x=y", "m") == \
        mf.DOCKER_MANIFEST
    assert mf.detect_media_type(json.dumps({"schemaVersion": 2, "manifests": []}).encode(), None, "i") == mf.OCI_INDEX


@pytest.mark.parametrize("data,mt,msg", [
    (b"not json", mf.OCI_MANIFEST, "not valid JSON"),
    (b"[]", mf.OCI_MANIFEST, "not a JSON object"),
    (json.dumps({"schemaVersion": 1}).encode(), mf.DOCKER_SCHEMA1_SIGNED, "schema 1"),
    (man(schemaVersion=3), mf.OCI_MANIFEST, "schemaVersion"),
    (man(config=desc("application/vnd.cncf.helm.config.v1+json")), mf.OCI_MANIFEST, "not a container image"),
    (man(layers=[desc("application/x-foo")]), mf.OCI_MANIFEST, "unsupported layer media type"),
    (man(layers=[desc(size=-1)]), mf.OCI_MANIFEST, "non-negative"),
    (man(layers=[desc(digest="sha256:xyz")]), mf.OCI_MANIFEST, "bad digest"),
    (man(), mf.OCI_INDEX, "does not match"),
    (b"{" + b" " * (mf.MAX_MANIFEST_BYTES + 1) + b"}", mf.OCI_MANIFEST, "larger than"),
])
def test_bad_manifests(data, mt, msg):
    with pytest.raises(InvalidManifest, match=msg):
        if mt in mf.INDEX_TYPES:
            mf.parse_index(data, mt)
        else:
            mf.parse_manifest(data, mt)


def _index(*plats) -> mf.Index:  # type: ignore[no-untyped-def]
    ms = []
    for i, p in enumerate(plats):
        d = desc(mf.OCI_MANIFEST, "sha256:" + f"{i:x}" * 64)
        if p is not None:
            parts = p.split("/")
            d["platform"] = {"os": parts[0], "architecture": parts[1], **({"variant": parts[2]} if len(parts) > 2 else {})}
        ms.append(d)
    return mf.parse_index(json.dumps({"schemaVersion": 2, "manifests": ms}).encode(), mf.OCI_INDEX)


def test_platform_selection():
    idx = _index("linux/arm64/v8", "linux/amd64", "unknown/unknown", None, "linux/arm/v6", "linux/arm/v7")
    assert mf.select_platform(idx, mf.parse_platform("linux/amd64"), "r").digest == "sha256:" + "1" * 64
    assert mf.select_platform(idx, mf.parse_platform("linux/arm64"), "r").digest == "sha256:" + "0" * 64
    assert mf.select_platform(idx, mf.parse_platform("linux/arm/v7"), "r").digest == "sha256:" + "5" * 64
    assert mf.select_platform(_index("linux/arm/v6"), mf.parse_platform("linux/arm/v7"), "r")
    with pytest.raises(PlatformNotFound, match="linux/s390x.*available: linux/arm64/v8, linux/amd64"):
        mf.select_platform(_index("linux/arm64/v8", "linux/amd64"), mf.parse_platform("linux/s390x"), "r")
    with pytest.raises(PlatformNotFound):
        mf.select_platform(_index("linux/arm/v7"), mf.parse_platform("linux/arm/v6"), "r")
    assert mf.parse_platform("linux/x86_64") == mf.Platform("linux", "amd64")
    with pytest.raises(InvalidManifest):
        mf.parse_platform("linux")


def _config(**cfg) -> bytes:  # type: ignore[no-untyped-def]
    return json.dumps({"os": "linux", "architecture": "amd64", "config": cfg,
                       "rootfs": {"type": "layers", "diff_ids": [H]}}).encode()


def test_parse_config():
    c = mf.parse_config(_config(User="1000:1000", Env=["A=1"], Entrypoint=["/bin/sh"], Cmd=["-c", "x"],
                                WorkingDir="/w", ExposedPorts={"80/tcp": {}, "53/udp": {}}, Volumes={"/v": {}},
                                Labels={"k": "v"}, StopSignal="SIGINT"))
    assert (c.user, c.env, c.entrypoint, c.cmd, c.working_dir, c.exposed_ports, c.volumes, c.labels,
            c.stop_signal, c.diff_ids) == ("1000:1000", ("A=1",), ("/bin/sh",), ("-c", "x"), "/w",
                                           ("53/udp", "80/tcp"), ("/v",), {"k": "v"}, "SIGINT", (H,))
    with pytest.raises(InvalidManifest, match="rootfs.type"):
        mf.parse_config(b'{"rootfs": {"type": "nope"}}')
    with pytest.raises(InvalidManifest, match="Env"):
        mf.parse_config(_config(Env="A=1"))


def test_chain_ids():
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    c = mf.chain_ids([a, b])
    assert c[0] == a and c[1] == mf.sha256_digest(f"{a} {b}".encode())


@pytest.mark.parametrize("user,want", [("", (None, "")), ("1002", (1002, "")), ("www-data", (None, "www-data")),
                                       ("1003:1004", (1003, "")), ("www-data:1004", (None, "www-data")),
                                       ("0", (0, ""))])
def test_split_user(user, want):
    assert split_user(user) == want


def test_record_tags_and_digests():
    row = ImageRow("sha256:" + "c" * 64, "sha256:" + "d" * 64, mf.OCI_MANIFEST, _config(User="www-data"),
                   [{"digest": H, "mediaType": mf.OCI_LAYER_GZIP, "size": 5, "diffID": H, "chainID": H}], [H], 99,
                   False, 0.0)
    idx = "sha256:" + "e" * 64
    names = [NameRow("docker.io/library/busybox:latest", row.id, idx),
             NameRow(f"docker.io/library/busybox@{idx}", row.id, idx),
             NameRow("quay.io/x/busybox:1", row.id, row.manifest_digest)]
    r = build_record(row, names)
    assert r.repo_tags == ("docker.io/library/busybox:latest", "quay.io/x/busybox:1")
    assert r.repo_digests == (f"docker.io/library/busybox@{idx}", f"quay.io/x/busybox@{row.manifest_digest}")
    assert (r.uid, r.username, r.chain_id, r.size) == (None, "www-data", H, 99)
