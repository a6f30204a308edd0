"""The images critest asks for beyond `scripts/build-test-images`' catalog, as local stand-ins: nginx, httpd,
hostnet-nginx, nonewprivs and the predefined-group image, plus a busybox whose applets run as separate
programs (critest's MaskedPaths spec needs `sh -c ls` to exec /bin/ls, which a static busybox does in-process).

Helpers are compiled from scripts/testsrc/*.c with the distro's gcc (static). The dynamic busybox comes from
Debian's `busybox` package, downloaded with apt-get (never installed) into a cache dir, with its libraries.
"""
from __future__ import annotations

import os
import subprocess

from cri_server.images.builder import Entry, ImageSpec, Layer
from cri_server.images.testimages import GROUP, PASSWD, busybox_entries

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(TOP, "scripts", "testsrc")
E2E = "e2e-test-images/"
STAGING = "k8s-staging-cri-tools/"
NGINX_INDEX = (b"<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n"
               b"<body><h1>Welcome to nginx!</h1><p>husk test stand-in</p></body></html>\n")
HTTPD_INDEX = b"<html><body><h1>It works!</h1></body></html>\n"

WEB = {
    "nginx": {"NAME": "nginx", "PROC_TITLE": "nginx: master process nginx -g daemon off;",
              "EXE": "/usr/sbin/nginx", "PID_FILE": "/var/run/nginx.pid", "DOC_ROOT": "/usr/share/nginx/html",
              "PORT_FILE": "/etc/nginx/port"},
    "httpd": {"NAME": "httpd", "PROC_TITLE": "httpd -DFOREGROUND", "EXE": "/usr/local/apache2/bin/httpd",
              "PID_FILE": "/usr/local/apache2/logs/httpd.pid", "DOC_ROOT": "/usr/local/apache2/htdocs",
              "PORT_FILE": "/usr/local/apache2/conf/port"},
}


def compile_helpers(build_dir: str) -> dict[str, str]:
    """nginx, httpd (the web server stand-in, two personalities) and nnp, static; name -> binary."""
    os.makedirs(build_dir, exist_ok=True)
    out = {}
    for name, defs in WEB.items():
        binary = os.path.join(build_dir, name)
        flags = [f'-D{k}="{v}"' for k, v in defs.items()]
        subprocess.run(["gcc", "-static", "-O2", *flags, "-o", binary, os.path.join(SRC, "webserver.c")],
                       check=True)
        out[name] = binary
    out["nnp"] = os.path.join(build_dir, "nnp")
    subprocess.run(["gcc", "-static", "-O2", "-o", out["nnp"], os.path.join(SRC, "nonewprivs.c")], check=True)
    return out


def dynamic_busybox(cache_dir: str) -> str:
    """Debian's dynamically linked busybox (the `busybox` package, extracted, not installed)."""
    root = os.path.join(cache_dir, "busybox-deb")
    binary = os.path.join(root, "bin", "busybox")
    if os.path.exists(binary):
        return binary
    os.makedirs(cache_dir, exist_ok=True)
    subprocess.run(["apt-get", "download", "busybox"], cwd=cache_dir, check=True, capture_output=True)
    deb = sorted(n for n in os.listdir(cache_dir) if n.startswith("busybox_") and n.endswith(".deb"))[-1]
    subprocess.run(["dpkg-deb", "-x", os.path.join(cache_dir, deb), root], check=True)
    return binary


def _libraries(binary: str) -> list[str]:
    """The shared libraries `binary` loads (ldd), including the dynamic loader."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


def busybox_layer(busybox: str) -> Layer:
    """The busybox base layer; for a dynamic busybox its libraries too, at their host paths."""
    entries = busybox_entries(busybox)
    have = {e.path for e in entries}
    for lib in _libraries(busybox):
        real = os.path.realpath(lib)
        for d in _parents(lib.lstrip("/")) + _parents(real.lstrip("/")):
            if d not in have:
                have.add(d)
                entries.append(Entry(d, "dir", 0o755))
        if real.lstrip("/") not in have:
            have.add(real.lstrip("/"))
            entries.append(Entry(real.lstrip("/"), "file", 0o755, src=real))
        if lib != real and lib.lstrip("/") not in have:
            have.add(lib.lstrip("/"))
            entries.append(Entry(lib.lstrip("/"), "symlink", target=real))
    return Layer(entries)


def _parents(path: str) -> list[str]:
    out = []
    p = os.path.dirname(path)
    while p:
        out.append(p)
        p = os.path.dirname(p)
    return list(reversed(out))


def _web_layer(binary: str, defs: dict[str, str], port: int, index: bytes, extra: list[Entry] = ()) -> Layer:
    files = [Entry(defs["EXE"].lstrip("/"), "file", 0o755, src=binary),
             Entry(defs["PORT_FILE"].lstrip("/"), "file", 0o644, data=f"{port}\n".encode()),
             Entry(defs["DOC_ROOT"].lstrip("/") + "/index.html", "file", 0o644, data=index),
             Entry(os.path.dirname(defs["PID_FILE"]).lstrip("/") + "/.keep", "file", 0o644), *extra]
    dirs: list[str] = []
    for e in files:
        for d in _parents(e.path):
            if d not in dirs:
                dirs.append(d)
    return Layer([Entry(d, "dir", 0o755) for d in dirs] + files)


def catalog(busybox: str, helpers: dict[str, str]) -> list[ImageSpec]:
    """The extra images, each on the busybox layer; registry paths without a host, as pushed."""
    base = busybox_layer(busybox)
    out = [ImageSpec("critest-busybox", [E2E + "busybox:1.29-2", "library/busybox:latest"], [base],
                     {"Cmd": ["sh"]})]
    nginx_cfg = {"Cmd": ["nginx", "-g", "daemon off;"], "ExposedPorts": {"80/tcp": {}}}
    out.append(ImageSpec("nginx", [E2E + "nginx:1.14-2"],
                         [base, _web_layer(helpers["nginx"], WEB["nginx"], 80, NGINX_INDEX)], nginx_cfg))
    out.append(ImageSpec("hostnet-nginx", [STAGING + "hostnet-nginx-amd64:latest"],
                         [base, _web_layer(helpers["nginx"], WEB["nginx"], 12003, NGINX_INDEX)],
                         {"Cmd": ["nginx", "-g", "daemon off;"], "ExposedPorts": {"12003/tcp": {}}}))
    link = [Entry("usr/local/bin/httpd-foreground", "symlink", target="/usr/local/apache2/bin/httpd")]
    out.append(ImageSpec("httpd", [E2E + "httpd:2.4.39-4"],
                         [base, _web_layer(helpers["httpd"], WEB["httpd"], 80, HTTPD_INDEX, link)],
                         {"Cmd": ["httpd-foreground"], "ExposedPorts": {"80/tcp": {}},
                          "WorkingDir": "/usr/local/apache2",
                          "Env": ["PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                                  "/sbin:/bin"]}))
    out.append(ImageSpec("nonewprivs", [E2E + "nonewprivs:1.3"],
                         [base, Layer([Entry("usr", "dir"), Entry("usr/local", "dir"), Entry("usr/local/bin", "dir"),
                                       Entry("usr/local/bin/nnp", "file", 0o4755, src=helpers["nnp"])])],
                         {"Entrypoint": ["/usr/local/bin/nnp"], "User": "1000"}))
    passwd = PASSWD + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n"
    group = GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"
    out.append(ImageSpec("test-image-predefined-group", [STAGING + "test-image-predefined-group:latest"],
                         [base, Layer([Entry("etc", "dir"), Entry("etc/passwd", "file", 0o644, data=passwd.encode()),
                                       Entry("etc/group", "file", 0o644, data=group.encode()),
                                       Entry("home", "dir"), Entry("home/default-user", "dir", 0o755, 1000, 1000)])],
                         {"Cmd": ["sh"], "User": "1000"}))
    return out
