"""The ImageService RPCs: ListImages, ImageStatus, PullImage, RemoveImage, ImageFsInfo.

Thin: everything is cri_server/images' ImageService; this maps its records and errors to CRI. An image's
id (its config digest) is also what PullImage returns as image_ref, and what containers report.
"""
from __future__ import annotations

import json
import logging

from cri_server.api.v1 import api_pb2 as pb
from cri_server.context import Services
from cri_server.errors import CriError, InvalidArgument
from cri_server.images.auth import AuthConfig
from cri_server.images.errors import ImageError
from cri_server.validation import check_request

log = logging.getLogger(__name__)


class _ImageFailure(CriError):
    def __init__(self, e: ImageError) -> None:
        super().__init__(str(e))
        self.code = getattr(e, "code", "UNKNOWN") or "UNKNOWN"


def to_image(rec: object) -> pb.Image:
    r = rec
    img = pb.Image(id=r.id, repo_tags=list(r.repo_tags), repo_digests=list(r.repo_digests),  # type: ignore
                   size=r.size, username=r.username, pinned=r.pinned,  # type: ignore[attr-defined]
                   spec=pb.ImageSpec(image=r.id, annotations=dict(getattr(r, "annotations", {}) or {})))  # type: ignore
    if r.uid is not None:  # type: ignore[attr-defined]
        img.uid.value = r.uid  # type: ignore[attr-defined]
    return img


async def list_images(svc: Services, req: pb.ListImagesRequest) -> pb.ListImagesResponse:
    """ListImages returns every image (or those matching the filter's reference)."""
    images = svc.need_images()
    recs = images.list()
    if req.HasField("filter") and req.filter.image.image:
        one = images.get(req.filter.image.image)
        recs = [one] if one is not None else []
    return pb.ListImagesResponse(images=[to_image(r) for r in recs])


async def image_status(svc: Services, req: pb.ImageStatusRequest) -> pb.ImageStatusResponse:
    """ImageStatus returns the image named by id, tag or digest, or no image (not an error) when absent;
    `verbose` adds its config and layers as JSON."""
    check_request(req)
    if not req.image.image:
        raise InvalidArgument("image.image: must not be empty")
    rec = svc.need_images().get(req.image.image)
    if rec is None:
        return pb.ImageStatusResponse()
    resp = pb.ImageStatusResponse(image=to_image(rec))
    if req.verbose:
        c = rec.config
        resp.info["info"] = json.dumps({
            "id": rec.id, "manifestDigest": rec.manifest_digest, "chainID": rec.chain_id,
            "layers": [{"digest": x.digest, "mediaType": x.media_type, "size": x.size, "diffID": x.diff_id}
                       for x in rec.layers],
            "config": {"User": c.user, "Env": list(c.env), "Entrypoint": list(c.entrypoint), "Cmd": list(c.cmd),
                       "WorkingDir": c.working_dir, "ExposedPorts": list(c.exposed_ports),
                       "Volumes": list(c.volumes), "Labels": dict(c.labels), "StopSignal": c.stop_signal},
            "os": c.os, "architecture": c.architecture, "pinned": rec.pinned})
    return resp


def _auth(req: pb.PullImageRequest) -> AuthConfig | None:
    """The request's credentials, None when it carries none; malformed `auth` is INVALID_ARGUMENT (a request
    field, not a refusal by the registry)."""
    if not req.HasField("auth"):
        return None
    a = req.auth
    auth = AuthConfig(username=a.username, password=a.password, auth=a.auth, server_address=a.server_address,
                      identity_token=a.identity_token, registry_token=a.registry_token)
    try:
        return None if auth.is_empty() else auth
    except ImageError as e:
        raise InvalidArgument(str(e)) from None


async def pull_image(svc: Services, req: pb.PullImageRequest) -> pb.PullImageResponse:
    """PullImage pulls the image (with the request's credentials) and returns its id as image_ref. A
    deadline from the client cancels the pull and leaves nothing half-done."""
    check_request(req)
    if not req.image.image:
        raise InvalidArgument("image.image: must not be empty")
    auth = _auth(req)
    try:
        rec = await svc.need_images().pull(req.image.image, auth)
    except ImageError as e:
        raise _ImageFailure(e) from None
    if req.HasField("sandbox_config"):
        md = req.sandbox_config.metadata
        log.info("image pulled for a pod", extra={"image": req.image.image, "id": rec.id,
                                                  "pod": f"{md.namespace}/{md.name}"})
    return pb.PullImageResponse(image_ref=rec.id)


async def remove_image(svc: Services, req: pb.RemoveImageRequest) -> pb.RemoveImageResponse:
    """RemoveImage removes the image with all its tags; removing an absent image succeeds."""
    check_request(req)
    if not req.image.image:
        raise InvalidArgument("image.image: must not be empty")
    try:
        await svc.need_images().remove(req.image.image)
    except ImageError as e:
        raise _ImageFailure(e) from None
    return pb.RemoveImageResponse()


async def image_fs_info(svc: Services, req: pb.ImageFsInfoRequest) -> pb.ImageFsInfoResponse:
    """ImageFsInfo reports the space and inodes images use, and (separately) containers' writable layers."""
    import asyncio
    images = svc.need_images()
    fi = images.fs_info()
    ci = await asyncio.to_thread(images.containers_fs_info)

    def usage(x: object) -> pb.FilesystemUsage:
        return pb.FilesystemUsage(timestamp=x.timestamp_ns, fs_id=pb.FilesystemIdentifier(mountpoint=x.mountpoint),  # type: ignore
                                  used_bytes=pb.UInt64Value(value=x.used_bytes),  # type: ignore[attr-defined]
                                  inodes_used=pb.UInt64Value(value=x.inodes_used))  # type: ignore[attr-defined]
    return pb.ImageFsInfoResponse(image_filesystems=[usage(fi)], container_filesystems=[usage(ci)])
