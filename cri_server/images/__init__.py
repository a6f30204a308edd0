"""Images for husk-cri: pull from OCI registries, content store, overlayfs snapshots, import/export, GC.

The entry point is `cri_server.images.service.ImageService`; importing this package imports nothing else.
"""
