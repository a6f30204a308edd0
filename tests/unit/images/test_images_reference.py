"""Reference parsing and normalisation (docker/containerd rules)."""
from __future__ import annotations

import pytest

from cri_server.images.errors import InvalidReference
from cri_server.images.reference import parse, validate_digest

D = "sha256:" + "a" * 64


@pytest.mark.parametrize("ref,want", [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:1.36", "docker.io/library/busybox:1.36"),
    ("library/busybox", "docker.io/library/busybox:latest"),
    ("user/app", "docker.io/user/app:latest"),
    ("docker.io/busybox", "docker.io/library/busybox:latest"),
    ("index.docker.io/library/busybox:1", "docker.io/library/busybox:1"),
    ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
    ("localhost/app", "localhost/app:latest"),
    ("localhost:5000/app", "localhost:5000/app:latest"),
    ("127.0.0.1:5000/a/b/c:v1", "127.0.0.1:5000/a/b/c:v1"),
    (f"busybox@{D}", f"docker.io/library/busybox@{D}"),
    (f"busybox:1.36@{D}", f"docker.io/library/busybox@{D}"),  # the digest wins, as in containerd
    ("gcr.io/k8s-staging-cri-tools/test-image-tags:1", "gcr.io/k8s-staging-cri-tools/test-image-tags:1"),
    ("a__b/c-d.e_f:TAG_1.x-y", "docker.io/a__b/c-d.e_f:TAG_1.x-y"),
    ("[::1]:5000/app:v", "[::1]:5000/app:v"),
])
def test_normalise(ref, want):
    assert str(parse(ref)) == want


def test_fields():
    r = parse("localhost:5000/team/app:v2")
    assert (r.domain, r.path, r.tag, r.digest, r.name, r.object) == (
        "localhost:5000", "team/app", "v2", None, "localhost:5000/team/app", "v2")
    assert parse("busybox").familiar() == "busybox:latest"
    assert parse("busybox", default_tag=None).tag is None


@pytest.mark.parametrize("ref,reason", [
    ("", "empty"),
    ("Busybox", "lowercase"),
    ("docker.io/Library/busybox", "lowercase"),
    ("busybox:", "invalid tag"),
    ("busybox:-bad", "invalid tag"),
    ("busybox@sha256:abc", "algorithm:hex"),
    ("busybox@md5:" + "a" * 32, "unsupported algorithm"),
    ("busybox@sha256:" + "A" * 64, "lowercase hex"),
    ("a" * 64, "image id"),
    ("bad..name", "invalid repository path"),
    ("-lead/x", "invalid registry host|invalid repository path"),
    (" busybox", "whitespace"),
    ("ex ample.com/x", "invalid"),
    ("x/" + "a" * 260, "longer than 255"),
    (":tag", "missing repository"),
])
def test_bad(ref, reason):
    with pytest.raises(InvalidReference, match=reason):
        parse(ref)


def test_validate_digest():
    assert validate_digest(D) == D
    assert validate_digest("sha512:" + "b" * 128)
    with pytest.raises(InvalidReference):
        validate_digest("sha256:" + "a" * 63)
