"""Pulls from the distro's docker-registry on 127.0.0.1: open, htpasswd and token auth; identity by id, tag,
digest; hostile registry content; platform selection; concurrency; no lookups outside this machine."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys

import pytest

from cri_server.images import manifest as mf
from cri_server.images.auth import AuthConfig
from cri_server.images.builder import ImageSpec, Layer, LayerCache, write_index_image
from cri_server.images.errors import (
    ContentError,
    DigestMismatch,
    NotFound,
    PlatformNotFound,
    RegistryError,
    ShortRead,
    Unauthorized,
)
from cri_server.images.service import ImageService
from tests.support.imagetest import certs_for, run
from tests.support.netguard import ExternalLookup
from tests.support.registry import PASSWORD, REFRESH_TOKEN, USER, LocalRegistry
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.root


def _svc(tmp_path, certs, **kw) -> ImageService:  # type: ignore[no-untyped-def]
    kw.setdefault("retry_backoff", 0.01)
    return ImageService(str(tmp_path / "root"), certs, **kw)


def _manifest_digest(layout: str) -> str:
    with open(os.path.join(layout, "index.json")) as f:
        return json.load(f)["manifests"][0]["digest"]


def test_pull_by_tag_and_identity(tmp_path, certs_dir, registry, test_images, netguard):
    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            rec = await svc.pull("busybox")
            want_manifest = _manifest_digest(test_images["busybox"])
            assert rec.repo_tags == ("docker.io/library/busybox:latest",)
            assert rec.repo_digests == (f"docker.io/library/busybox@{want_manifest}",)
            assert rec.manifest_digest == want_manifest
            assert rec.config.cmd == ("sh",) and rec.uid is None and rec.username == ""
            for x in rec.layers:  # every blob verified and present
                svc.content.verify(x.digest)
            svc.content.verify(rec.id)
            # the same object by id, bare hex id, tag, short name, digest reference, short id
            keys = [rec.id, rec.id[7:], "docker.io/library/busybox:latest", "busybox", "busybox:latest",
                    "library/busybox", f"busybox@{want_manifest}", rec.id[7:19], rec.id[:19]]
            for k in keys:
                assert svc.get(k) == rec, k
            assert svc.get("busybox:other") is None and svc.get("sha256:" + "0" * 64) is None
            assert svc.list() == [rec]
            info = svc.fs_info()
            assert info.used_bytes > 1_000_000 and info.inodes_used > 20 and info.timestamp_ns > 0  # applets are hard links
        finally:
            await svc.close()
    run(main())
    assert set(netguard.lookups) <= {"127.0.0.1"}


def test_pull_by_digest_and_more_tags(tmp_path, certs_dir, registry, test_images):
    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            d = _manifest_digest(test_images["busybox"])
            ref = f"registry.k8s.io/e2e-test-images/busybox@{d}"
            rec = await svc.pull(ref)
            assert rec.repo_tags == () and rec.repo_digests == (ref,)
            rec2 = await svc.pull("registry.k8s.io/e2e-test-images/busybox:1.29-2")
            assert rec2.id == rec.id and rec2.repo_tags == ("registry.k8s.io/e2e-test-images/busybox:1.29-2",)
            tags = [await svc.pull(f"gcr.io/k8s-staging-cri-tools/test-image-tags:{t}") for t in ("1", "2")]
            assert tags[0].id == tags[1].id and len(tags[1].repo_tags) == 2
            assert len(svc.list()) == 2
            # removing by one tag removes every tag of the image; again is a no-op
            assert await svc.remove("gcr.io/k8s-staging-cri-tools/test-image-tags:1")
            assert svc.get("gcr.io/k8s-staging-cri-tools/test-image-tags:2") is None
            assert not await svc.remove("gcr.io/k8s-staging-cri-tools/test-image-tags:2")
            assert [r.id for r in svc.list()] == [rec.id]
        finally:
            await svc.close()
    run(main())


@pytest.mark.parametrize("name,uid,username", [("test-image-user-uid", 1002, ""),
                                               ("test-image-user-username", None, "www-data")])
def test_image_user(tmp_path, certs_dir, registry, name, uid, username):
    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            rec = await svc.pull(f"gcr.io/k8s-staging-cri-tools/{name}")
            assert (rec.uid, rec.username) == (uid, username)
        finally:
            await svc.close()
    run(main())


def test_missing_image_fails_locally(tmp_path, certs_dir, registry, netguard):
    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            with pytest.raises(NotFound) as ei:
                await svc.pull("docker.io/library/busybox:does-not-exist")
            assert registry.addr in str(ei.value)
            with pytest.raises(NotFound):
                await svc.pull("registry.k8s.io/no/such/repo")
        finally:
            await svc.close()
    run(main())
    assert netguard.refused == [] and set(netguard.lookups) <= {"127.0.0.1"}


def test_without_hosts_toml_the_upstream_is_used(tmp_path, netguard):
    """The default configuration goes to the real upstream; the guard shows it and refuses the lookup."""
    async def main():
        svc = _svc(tmp_path, None, retries=0)
        try:
            with pytest.raises(ExternalLookup):
                await svc.pull("busybox")
        finally:
            await svc.close()
    run(main())
    assert netguard.refused == ["registry-1.docker.io"]


def test_htpasswd_registry(tmp_path, htpasswd_registry):
    certs = certs_for(str(tmp_path), htpasswd_registry)
    ref = f"{htpasswd_registry.addr}/private/layered:v1"

    async def main():
        svc = _svc(tmp_path, certs)
        try:
            with pytest.raises(Unauthorized, match="requires credentials"):
                await svc.pull(ref)
            with pytest.raises(Unauthorized, match="refused"):
                await svc.pull(ref, AuthConfig(username=USER, password="wrong"))
            rec = await svc.pull(ref, AuthConfig(username=USER, password=PASSWORD))
            svc2_auth = AuthConfig(auth=base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
            await svc.remove(rec.id)
            rec2 = await svc.pull(ref, svc2_auth)
            assert rec2.id == rec.id
            # credentials for another server are not sent
            with pytest.raises(Unauthorized):
                await svc.pull(ref, AuthConfig(username=USER, password=PASSWORD, server_address="elsewhere.test"))
        finally:
            await svc.close()
    run(main())


def test_token_registry(tmp_path, token_registry):
    certs = certs_for(str(tmp_path), token_registry)
    private = f"{token_registry.addr}/private/layered:v1"
    public = f"{token_registry.addr}/public/busybox:latest"
    tok = token_registry.token
    assert tok is not None

    async def main():
        svc = _svc(tmp_path, certs)
        try:
            await svc.pull(public)  # anonymous token
            with pytest.raises(Unauthorized):
                await svc.pull(private)
            with pytest.raises(Unauthorized, match="refused"):
                await svc.pull(private, AuthConfig(username=USER, password="nope"))
            rec = await svc.pull(private, AuthConfig(username=USER, password=PASSWORD))
            await svc.remove(rec.id)
            await svc.gc(wait=True)
            await svc.pull(private, AuthConfig(identity_token=REFRESH_TOKEN))
            await svc.remove(rec.id)
            await svc.gc(wait=True)
            raw = tok.issue(USER, ["repository:private/layered:pull"])
            await svc.pull(private, AuthConfig(registry_token=raw))
        finally:
            await svc.close()
    run(main())
    users = [r.get("user") for r in tok.requests if not r.get("denied")]
    assert None in users and USER in users
    assert any(r.get("refresh") and not r.get("denied") for r in tok.requests)
    scopes = {s for r in tok.requests for s in r.get("scopes", [])}
    assert "repository:private/layered:pull" in scopes


# -- hostile registry content --------------------------------------------------------------------------------

@pytest.fixture
def own_registry(tmp_path, test_images):
    """A registry of this test's own (its storage gets corrupted) with the layered image."""
    reg = LocalRegistry(str(tmp_path / "reg"))
    reg.start()
    try:
        reg.push(test_images["layered"], "husk-test/layered:v1")
        yield reg
    finally:
        reg.stop()


def _layered_manifest(test_images) -> dict:  # type: ignore[no-untyped-def,type-arg]
    layout = test_images["layered"]
    with open(os.path.join(layout, "blobs", "sha256", _manifest_digest(layout)[7:])) as f:
        return json.load(f)


def _no_image_and_no_blob(svc: ImageService, digest: str) -> None:
    assert svc.list() == []
    assert digest not in {b.digest for b in svc.content.list()}


def test_manifest_digest_mismatch(tmp_path, own_registry, test_images):
    man_digest = _manifest_digest(test_images["layered"])
    path = own_registry.blob_file(man_digest)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data.replace(b'"schemaVersion":2', b'"schemaVersion": 2'))
    certs = certs_for(str(tmp_path), own_registry)

    async def main():
        svc = _svc(tmp_path, certs)
        try:
            with pytest.raises(DigestMismatch):
                await svc.pull(f"{own_registry.addr}/husk-test/layered:v1")
            with pytest.raises(DigestMismatch):
                await svc.pull(f"{own_registry.addr}/husk-test/layered@{man_digest}")
            assert svc.list() == [] and svc.content.list() == []
        finally:
            await svc.close()
    run(main())


def test_truncated_layer_blob(tmp_path, own_registry, test_images):
    layer = _layered_manifest(test_images)["layers"][1]
    path = own_registry.blob_file(layer["digest"])
    os.truncate(path, layer["size"] // 2)
    certs = certs_for(str(tmp_path), own_registry)

    async def main():
        svc = _svc(tmp_path, certs, retries=1)
        try:
            with pytest.raises((ShortRead, ContentError)) as ei:
                await svc.pull(f"{own_registry.addr}/husk-test/layered:v1")
            assert layer["digest"] in str(ei.value)
            _no_image_and_no_blob(svc, layer["digest"])
        finally:
            await svc.close()
    run(main())


def test_corrupted_layer_blob(tmp_path, own_registry, test_images):
    layer = _layered_manifest(test_images)["layers"][1]
    path = own_registry.blob_file(layer["digest"])
    with open(path, "r+b") as f:
        f.seek(layer["size"] // 2)
        b = f.read(1)
        f.seek(layer["size"] // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    certs = certs_for(str(tmp_path), own_registry)

    async def main():
        svc = _svc(tmp_path, certs)
        try:
            with pytest.raises(DigestMismatch) as ei:
                await svc.pull(f"{own_registry.addr}/husk-test/layered:v1")
            assert layer["digest"] in str(ei.value)
            _no_image_and_no_blob(svc, layer["digest"])
            # the bad data is gone (other layers' downloads, cancelled, may stay for a resume)
            assert layer["digest"][7:] + ".partial" not in os.listdir(svc.content.ingest_dir)
        finally:
            await svc.close()
    run(main())


def _push_multiarch(tmp_path, reg: LocalRegistry, archs: list[str], name: str) -> str:
    layer = Layer([])
    specs = [ImageSpec(f"img-{a}", [name], [layer], {"Cmd": ["x"], "Labels": {"arch": a}}, architecture=a)
             for a in archs]
    built = write_index_image(str(tmp_path / "layouts"), "multi", specs, LayerCache(),
                              variants={"img-arm64": "v8"})
    p = subprocess.run(["skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false", "--preserve-digests",
                        f"oci:{built.layout}:latest", f"docker://{reg.addr}/{name}"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    return built.manifest_digest


def test_platform_selection(tmp_path, own_registry):
    index_digest = _push_multiarch(tmp_path, own_registry, ["arm64", "amd64", "s390x"], "multi/all:v1")
    _push_multiarch(tmp_path, own_registry, ["arm64", "s390x"], "multi/noamd64:v1")
    certs = certs_for(str(tmp_path), own_registry)

    async def main():
        svc = _svc(tmp_path, certs, platform="linux/amd64")
        try:
            rec = await svc.pull(f"{own_registry.addr}/multi/all:v1")
            assert rec.labels == {"arch": "amd64"}
            assert rec.repo_digests == (f"{own_registry.addr}/multi/all@{index_digest}",)
            arm = await svc.pull(f"{own_registry.addr}/multi/all:v1", platform="linux/arm64")
            assert arm.labels == {"arch": "arm64"}
            with pytest.raises(PlatformNotFound) as ei:
                await svc.pull(f"{own_registry.addr}/multi/noamd64:v1")
            assert "linux/arm64/v8" in str(ei.value) and "linux/s390x" in str(ei.value)
        finally:
            await svc.close()
    run(main())


# -- concurrency ---------------------------------------------------------------------------------------------

def test_concurrent_pulls_download_and_unpack_once(tmp_path, certs_dir, registry, monkeypatch):
    from cri_server.images.content import ContentStore
    from cri_server.images.snapshots import Snapshotter
    downloads: list[str] = []
    unpacks: list[str] = []
    orig_ingest = ContentStore._ingest_locked
    orig_apply = Snapshotter._apply

    async def counting_ingest(self, digest, *a, **kw):  # type: ignore[no-untyped-def]
        downloads.append(digest)
        return await orig_ingest(self, digest, *a, **kw)

    def counting_apply(apply, blob, *a, **kw):  # type: ignore[no-untyped-def]
        unpacks.append(blob)
        return orig_apply(apply, blob, *a, **kw)
    monkeypatch.setattr(ContentStore, "_ingest_locked", counting_ingest)
    monkeypatch.setattr(Snapshotter, "_apply", staticmethod(counting_apply))

    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            refs = ["busybox", "docker.io/library/busybox:latest", "gcr.io/k8s-staging-cri-tools/test-image-user-uid",
                    "gcr.io/k8s-staging-cri-tools/test-image-user-username", "docker.io/husk-test/layered:v1"]
            recs = await asyncio.gather(*(svc.pull(r) for r in refs * 2))
            assert len({r.id for r in recs}) == 4
        finally:
            await svc.close()
    run(main())
    assert len(downloads) == len(set(downloads))
    assert len(unpacks) == len(set(unpacks)) == 4  # busybox base layer (shared by 4 images) + 3 layered layers


def test_cli_and_service_on_one_root(tmp_path, certs_dir, registry):
    """The operator CLI and a running service share a root: both pull at once, each sees the other's images."""
    root = str(tmp_path / "root")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    cli = [sys.executable, "-m", "cri_server.images.cli"]
    opts = ["--root", root, "--registry-config-dir", certs_dir]

    async def main():
        svc = ImageService(root, certs_dir)
        try:
            proc = await asyncio.create_subprocess_exec(*cli, "pull", "-q", "docker.io/husk-test/layered:v1", *opts,
                                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            rec, (out, err) = await asyncio.gather(svc.pull("docker.io/husk-test/layered:v1"), proc.communicate())
            assert proc.returncode == 0, err.decode()
            assert out.decode().strip() == rec.id
            p = await asyncio.create_subprocess_exec(*cli, "pull", "-q", "busybox", *opts, env=env,
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await p.communicate()
            assert p.returncode == 0, err.decode()
            assert svc.get("busybox") is not None  # the daemon sees the CLI's pull at once
            assert len(svc.db.layers()) == 4
        finally:
            await svc.close()
    run(main())
    ls = subprocess.run(cli + ["ls", *opts], capture_output=True, text=True, env=env)
    assert ls.returncode == 0 and "docker.io/husk-test/layered" in ls.stdout and "docker.io/library/busybox" in ls.stdout
    rm = subprocess.run(cli + ["rm", "busybox", "docker.io/husk-test/layered:v1", *opts], capture_output=True,
                        text=True, env=env)
    assert rm.returncode == 0, rm.stderr
    assert "freed" in rm.stdout
    ls = subprocess.run(cli + ["ls", "-q", *opts], capture_output=True, text=True, env=env)
    assert ls.stdout.strip() == ""


def test_pull_deadline_leaves_nothing_half_done(tmp_path, certs_dir, registry):
    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(svc.pull("docker.io/husk-test/layered:v1"), 0.001)
            assert svc.list() == []
            # the cancelled download unwinds in its own task: let it finish before pulling again
            await wait_for_async(lambda: asyncio.all_tasks() == {asyncio.current_task()}, 30,
                                 lambda: f"the cancelled pull to finish: {asyncio.all_tasks()}")
            rec = await svc.pull("docker.io/husk-test/layered:v1")
            assert svc.get(rec.id) is not None
            assert all(x.state == "ready" for x in svc.db.layers())
            assert os.listdir(svc.snapshots.tmp_dir) == []
        finally:
            await svc.close()
    run(main())


def test_platform_helpers():
    assert mf.parse_platform("linux/arm/v7") == mf.Platform("linux", "arm", "v7")


def test_https_registry_with_hosts_toml_ca(tmp_path, test_images):
    reg = LocalRegistry(str(tmp_path / "reg"), tls=True)
    os.makedirs(reg.workdir)
    reg.start()
    try:
        reg.push(test_images["pause"], "pause:3.9")
        ref = f"{reg.addr}/pause:3.9"

        def certs(name: str, extra: str) -> str:
            d = tmp_path / name / reg.addr
            d.mkdir(parents=True)
            (d / "hosts.toml").write_text(f'server = "https://{reg.addr}"\n{extra}')
            return str(tmp_path / name)

        async def main():
            svc = _svc(tmp_path, certs("plain", ""), retries=0)
            try:
                with pytest.raises(RegistryError, match="certificate verify failed"):
                    await svc.pull(ref)
            finally:
                await svc.close()
            for name, extra in (("ca", f'ca = "{reg.ca_path}"\n'), ("skip", "skip_verify = true\n")):
                svc = ImageService(str(tmp_path / f"root-{name}"), certs(name, extra))
                try:
                    rec = await svc.pull(ref)
                    assert rec.repo_tags == (ref,)
                finally:
                    await svc.close()
        run(main())
    finally:
        reg.stop()


def test_shared_pull_survives_one_caller_giving_up(tmp_path, certs_dir, registry):
    async def main():
        svc = _svc(tmp_path, certs_dir)
        try:
            patient = asyncio.ensure_future(svc.pull("docker.io/husk-test/layered:v1"))
            await asyncio.sleep(0)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(svc.pull("docker.io/husk-test/layered:v1"), 0.001)
            rec = await patient  # the other caller's pull was not cancelled with it
            assert svc.get(rec.id) is not None
            # alone, a caller that gives up cancels the work itself
            await svc.remove(rec.id)
            await svc.gc(wait=True)
            started: list[asyncio.Task] = []  # type: ignore[type-arg]
            real_pull = svc._pull

            async def spy(*a, **kw):  # type: ignore[no-untyped-def]
                started.append(asyncio.current_task())  # type: ignore[arg-type]
                return await real_pull(*a, **kw)
            svc._pull = spy  # type: ignore[method-assign]
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(svc.pull("busybox"), 0.001)
            if started:  # the work had begun: it must end cancelled, not finish in the background
                with pytest.raises(asyncio.CancelledError):
                    await started[0]
            assert svc.list() == [] and not svc._pulls
        finally:
            await svc.close()
    run(main())


def test_interrupted_pull_resumes_or_restarts(tmp_path, certs_dir, registry, test_images):
    """A partial download left by an earlier (killed) process is resumed with a Range request; a partial with
    bad bytes fails the digest check once, is deleted, and the next pull starts over cleanly."""
    layout = test_images["layered"]
    layer = _layered_manifest(test_images)["layers"][1]
    with open(os.path.join(layout, "blobs", "sha256", layer["digest"][7:]), "rb") as f:
        blob = f.read()

    async def main():
        for good in (True, False):
            root = tmp_path / f"root-{good}"
            svc = ImageService(str(root), certs_dir, retry_backoff=0.01)
            try:
                half = blob[: len(blob) // 2] if good else b"\0" * (len(blob) // 2)
                with open(os.path.join(svc.content.ingest_dir, layer["digest"][7:] + ".partial"), "wb") as f:
                    f.write(half)
                if good:
                    rec = await svc.pull("docker.io/husk-test/layered:v1")
                    svc.content.verify(layer["digest"])
                    assert svc.get(rec.id) is not None
                else:
                    with pytest.raises(DigestMismatch):
                        await svc.pull("docker.io/husk-test/layered:v1")
                    assert not svc.content.exists(layer["digest"])
                    rec = await svc.pull("docker.io/husk-test/layered:v1")
                    svc.content.verify(layer["digest"])
                assert os.listdir(svc.snapshots.tmp_dir) == []
                assert not [n for n in os.listdir(svc.content.ingest_dir) if n.endswith(".partial")]
            finally:
                await svc.close()
    run(main())
