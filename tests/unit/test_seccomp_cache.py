"""The compiled-BPF cache: keyed by the profile's digest, written atomically, never trusted when corrupt."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime import seccomp, seccomp_lib


def _profile() -> dict:
    return seccomp.default_profile()


def test_digest_ignores_key_order_and_load_only_fields() -> None:
    p = _profile()
    version = seccomp_lib.version()
    reordered = dict(reversed(list(p.items())))
    assert seccomp.profile_digest(p, version) == seccomp.profile_digest(reordered, version)
    loaded_differently = dict(p, flags=["SECCOMP_FILTER_FLAG_LOG"], listenerPath="/x", listenerMetadata="m")
    assert seccomp.profile_digest(p, version) == seccomp.profile_digest(loaded_differently, version)


def test_digest_changes_with_the_program_and_the_library() -> None:
    p = _profile()
    version = seccomp_lib.version()
    other = dict(p, defaultErrnoRet=38)
    assert seccomp.profile_digest(p, version) != seccomp.profile_digest(other, version)
    assert seccomp.profile_digest(p, version) != seccomp.profile_digest(p, version + "-other")


def test_first_prepare_compiles_and_stores_then_the_cache_serves(tmp_path) -> None:
    cache = tmp_path / "cache"
    first = seccomp.prepare(_profile(), cache_dir=str(cache))
    assert not first.from_cache
    entry = cache / f"{first.digest}.bpf"
    assert entry.is_file()
    assert entry.stat().st_mode & 0o777 == 0o600
    assert cache.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no temp file left behind
    second = seccomp.prepare(_profile(), cache_dir=str(cache))
    assert second.from_cache
    assert second.program == first.program
    assert second.flags == first.flags and second.digest == first.digest


def test_cached_path_does_not_compile(tmp_path, monkeypatch) -> None:
    seccomp.prepare(_profile(), cache_dir=str(tmp_path))

    def no_compile(*a: object, **kw: object) -> bytes:
        raise AssertionError("compiled although the cache has the program")

    monkeypatch.setattr(seccomp, "compile_profile", no_compile)
    assert seccomp.prepare(_profile(), cache_dir=str(tmp_path)).from_cache


def test_compiling_is_deterministic() -> None:
    p = _profile()
    assert seccomp.prepare(p, cache_dir=None).program == seccomp.prepare(p, cache_dir=None).program


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "magic"])
def test_corrupt_entry_falls_back_to_compiling_and_is_replaced(tmp_path, damage: str) -> None:
    good = seccomp.prepare(_profile(), cache_dir=str(tmp_path))
    entry = tmp_path / f"{good.digest}.bpf"
    data = entry.read_bytes()
    if damage == "truncate":
        data = data[:-5]
    elif damage == "flip":
        data = data[:-1] + bytes([data[-1] ^ 1])
    elif damage == "garbage":
        data = os.urandom(len(data))
    elif damage == "empty":
        data = b""
    else:
        data = b"X" + data[1:]
    entry.write_bytes(data)
    again = seccomp.prepare(_profile(), cache_dir=str(tmp_path))
    assert not again.from_cache
    assert again.program == good.program
    assert seccomp.prepare(_profile(), cache_dir=str(tmp_path)).from_cache


def test_entry_writable_by_others_is_not_trusted(tmp_path) -> None:
    good = seccomp.prepare(_profile(), cache_dir=str(tmp_path))
    entry = tmp_path / f"{good.digest}.bpf"
    os.chmod(entry, 0o666)
    assert seccomp.read_cached(str(tmp_path), good.digest) is None
    os.chmod(entry, 0o600)
    assert seccomp.read_cached(str(tmp_path), good.digest) == good.program


def test_symlinked_entry_is_not_followed(tmp_path) -> None:
    good = seccomp.prepare(_profile(), cache_dir=str(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    os.symlink(tmp_path / "a" / f"{good.digest}.bpf", tmp_path / "b" / f"{good.digest}.bpf")
    assert seccomp.read_cached(str(tmp_path / "b"), good.digest) is None


def test_unwritable_cache_still_gives_a_program(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    compiled = seccomp.prepare(_profile(), cache_dir=str(blocker / "cache"))
    assert not compiled.from_cache and compiled.instructions > 100


def test_cache_hit_neither_compiles_nor_imports_heavy_modules(tmp_path) -> None:
    # In a fresh interpreter, a cache hit must neither compile nor resolve names, and stays off the
    # modules that cost milliseconds to import.
    seccomp.prepare(_profile(), cache_dir=str(tmp_path))
    import runtime

    top = os.path.dirname(os.path.dirname(os.path.abspath(runtime.__file__)))
    code = (
        f"import sys; sys.path.insert(0, {top!r})\n"
        "from runtime import seccomp, seccomp_lib\n"
        "calls = []\n"
        "for name in ('resolve_syscall', 'arch_token', 'FilterContext'):\n"
        "    orig = getattr(seccomp_lib, name)\n"
        "    setattr(seccomp_lib, name, lambda *a, _n=name, **k: calls.append(_n))\n"
        f"c = seccomp.prepare(seccomp.default_profile(), cache_dir={str(tmp_path)!r})\n"
        "assert c.from_cache, 'not from cache'\n"
        "assert not calls, calls\n"
        "heavy = {'dataclasses', 'typing', 'logging', 'hashlib', 'inspect'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    # -I -S: no site hooks, as the runtime's launcher; only what runtime.seccomp imports itself is loaded.
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_flags_follow_the_profile() -> None:
    p = dict(_profile(), flags=["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG",
                                "SECCOMP_FILTER_FLAG_SPEC_ALLOW"])
    compiled = seccomp.prepare(p, cache_dir=None)
    assert compiled.flags == seccomp.FLAG_TSYNC | seccomp.FLAG_LOG | seccomp.FLAG_SPEC_ALLOW
    assert not compiled.needs_listener
    notify = {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/x", "flags": ["SECCOMP_FILTER_FLAG_TSYNC"],
              "syscalls": [{"names": ["mknodat"], "action": "SCMP_ACT_NOTIFY"}]}
    compiled = seccomp.prepare(notify, cache_dir=None)
    assert compiled.needs_listener
    assert compiled.flags == seccomp.FLAG_TSYNC | seccomp.FLAG_NEW_LISTENER | seccomp.FLAG_TSYNC_ESRCH
    assert compiled.listener_path == "/x"


def test_libseccomp_no_new_privs_attribute_is_off(monkeypatch) -> None:
    seen: list[tuple[int, int]] = []
    orig = seccomp_lib.FilterContext.set_attr

    def record(self: seccomp_lib.FilterContext, attr: int, value: int) -> None:
        orig(self, attr, value)
        seen.append((attr, self.get_attr(attr)))

    monkeypatch.setattr(seccomp_lib.FilterContext, "set_attr", record)
    seccomp.prepare(_profile(), cache_dir=None)
    assert (seccomp_lib.ATTR_CTL_NNP, 0) in seen
