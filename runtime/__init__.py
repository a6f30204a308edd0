"""husk's OCI runtime: runc's command line over the project's own namespace, rootfs, cgroup and security code.

Must not import anything from shim/ or cri_server/ (imports flow cri_server -> shim -> runtime).
"""
