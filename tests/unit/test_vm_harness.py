"""scripts/vm helpers without a VM: the cpio writer (round trip, device nodes, padding), module dependency
order, .modinfo parsing from an ELF file, vm-test's argument handling, and vm-test's verdict on a guest that hangs,
ends without a status or reports one (a fake emulator through --qemu: a hang is 124, no status 125, never a pass)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import signal
import stat
import struct
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]


def load(name: str, path: Path):
    loader = importlib.machinery.SourceFileLoader(name, str(path))   # vm-test has no .py suffix
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


initramfs = load("initramfs", TOP / "scripts" / "vm" / "initramfs.py")


def test_cpio_round_trip_keeps_names_modes_data_and_devices() -> None:
    entries = [initramfs.dir_entry("bin"), initramfs.file_entry("bin/x", b"abc", 0o755),
               initramfs.file_entry("empty", b""), initramfs.symlink_entry("bin/sh", "busybox"),
               initramfs.chardev_entry("dev/console", 5, 1)]
    blob = initramfs.write_cpio(entries)
    assert len(blob) % 4 == 0
    assert initramfs.read_cpio(blob) == entries
    console = initramfs.read_cpio(blob)[-1]
    assert stat.S_ISCHR(console.mode) and console.rdev == (5, 1)


def test_cpio_is_reproducible() -> None:
    entries = [initramfs.file_entry("a", b"1" * 7)]
    assert initramfs.write_cpio(entries) == initramfs.write_cpio(entries)


def test_modules_come_after_their_dependencies() -> None:
    index = {n: Path(f"/m/{n}.ko") for n in ("9p", "9pnet", "9pnet_virtio", "netfs", "virtio_ring", "overlay")}
    depends = {"9p": ["9pnet", "netfs"], "9pnet_virtio": ["9pnet", "virtio_ring", "virtio"], "9pnet": []}
    order = initramfs.resolve_modules(["9pnet_virtio", "9p", "overlay"], index, {"virtio"}, depends)
    assert order == ["9pnet", "virtio_ring", "9pnet_virtio", "netfs", "9p", "overlay"]


def test_missing_module_and_cycles_are_reported() -> None:
    index = {"a": Path("a.ko"), "b": Path("b.ko")}
    with pytest.raises(ValueError, match="'c' .*needed by a"):
        initramfs.resolve_modules(["a"], index, set(), {"a": ["c"]})
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        initramfs.resolve_modules(["a"], index, set(), {"a": ["b"], "b": ["a"]})


def fake_module(path: Path, modinfo: bytes) -> None:
    """A minimal little-endian ELF64 with a section header table: null, .modinfo, .shstrtab."""
    shstr = b"\0.modinfo\0.shstrtab\0"
    body_off = 64
    modinfo_off, shstr_off = body_off, body_off + len(modinfo)
    shoff = shstr_off + len(shstr)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)

    def section(name: int, offset: int, size: int) -> bytes:
        sh = bytearray(64)
        struct.pack_into("<I", sh, 0, name)
        struct.pack_into("<QQ", sh, 24, offset, size)
        return bytes(sh)

    path.write_bytes(bytes(header) + modinfo + shstr + section(0, 0, 0) + section(1, modinfo_off, len(modinfo))
                     + section(10, shstr_off, len(shstr)))


def test_modinfo_and_index_from_files(tmp_path: Path) -> None:
    kdir = tmp_path / "kernel" / "fs"
    kdir.mkdir(parents=True)
    fake_module(kdir / "9p.ko", b"license=GPL\0depends=9pnet,netfs\0alias=fs-9p\0alias=9p2\0")
    fake_module(kdir / "9pnet.ko", b"depends=\0")
    fake_module(kdir / "netfs.ko", b"license=GPL\0")
    (tmp_path / "modules.builtin").write_text("kernel/drivers/virtio/virtio.ko\n")
    info = initramfs.modinfo(kdir / "9p.ko")
    assert info["depends"] == "9pnet,netfs" and info["alias"] == "fs-9p"
    index = initramfs.module_index(tmp_path)
    assert set(index) == {"9p", "9pnet", "netfs"}
    assert initramfs.builtin_modules(tmp_path) == {"virtio"}
    assert initramfs.resolve_modules(["9p"], index, set()) == ["9pnet", "netfs", "9p"]


def test_not_an_elf_file(tmp_path: Path) -> None:
    (tmp_path / "x.ko").write_bytes(b"#!/bin/sh\n" + b"\0" * 64)
    with pytest.raises(ValueError, match="not a little-endian ELF64"):
        initramfs.modinfo(tmp_path / "x.ko")


def test_vm_test_defaults_to_tests_vm(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(TOP / "scripts" / "vm"))
    for var in ("HUSK_VM_ACCEL", "HUSK_VM_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    vm_test = load("vm_test", TOP / "scripts" / "vm-test")
    assert vm_test.parse_args([])[1] == ["tests/vm"]
    opts, args = vm_test.parse_args(["--timeout", "60", "-k", "oom", "-q"])
    assert opts.timeout == 60 and args == ["-k", "oom", "-q", "tests/vm"]
    assert vm_test.parse_args(["tests/vm/test_cgroup_v2_files.py::test_stats", "-x"])[1] == [
        "tests/vm/test_cgroup_v2_files.py::test_stats", "-x"]
    assert vm_test.parse_args([])[0].accel == "tcg"


def test_node_option_selects_tests_node_and_a_longer_timeout(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(TOP / "scripts" / "vm"))
    monkeypatch.delenv("HUSK_VM_TIMEOUT", raising=False)
    vm_test = load("vm_test", TOP / "scripts" / "vm-test")
    opts, args = vm_test.parse_args(["--node", "-k", "oom"])
    assert opts.node and args == ["-k", "oom", "tests/node"] and opts.timeout == vm_test.DEFAULT_NODE_TIMEOUT
    opts, args = vm_test.parse_args(["--node", "--timeout", "90", "tests/vm"])
    assert opts.timeout == 90 and args == ["tests/vm"]
    assert not vm_test.parse_args([])[0].node and vm_test.parse_args([])[0].timeout == vm_test.DEFAULT_TIMEOUT
    monkeypatch.setenv("HUSK_VM_TIMEOUT", "33")
    assert vm_test.parse_args(["--node"])[0].timeout == 33


def test_only_the_node_guest_boots_systemd(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(TOP / "scripts" / "vm"))
    vm_test = load("vm_test", TOP / "scripts" / "vm-test")
    k = vm_test.kernel.Kernel(package="p", version="0", release="0", vmlinuz=tmp_path / "vmlinuz", modules=[])

    def cmdline(*argv: str) -> list[str]:
        opts, _ = vm_test.parse_args(list(argv))
        cmd = vm_test.qemu_command(opts, k, tmp_path / "initrd", tmp_path)
        return cmd[cmd.index("-append") + 1].split()

    plain, node = cmdline(), cmdline("--node")
    assert "cgroup_no_v1=all" in plain and "cgroup_no_v1=all" in node
    assert not any(a.startswith(("husk.node", "systemd.")) for a in plain)
    assert {"husk.node=1", "systemd.unit=husk-node.target", "systemd.unified_cgroup_hierarchy=1"} <= set(node)
    # init.sh switches to systemd only on husk.node=1, and the target it boots is the one shipped
    init = (TOP / "scripts" / "vm" / "init.sh").read_text()
    assert '*" husk.node=1 "*) node=1' in init and "switch_root /newroot /lib/systemd/systemd" in init
    assert (vm_test.NODE_DIR / "husk-node.target").exists()
    masked = (vm_test.NODE_DIR / "masked").read_text().split()
    assert "husk-vm-job.service" not in masked and "dbus.service" not in masked


def test_initramfs_extra_files_get_their_parent_directories(tmp_path: Path) -> None:
    (tmp_path / "busybox").write_bytes(b"\x7fELF fake")
    blob = initramfs.build(tmp_path / "busybox", "#!/bin/sh\n", [], {"node/a/x.service": (b"[Unit]\n", 0o644), "init.stage2": (b"", 0o755)})
    entries = initramfs.read_cpio(blob)
    names = [e.name for e in entries]
    assert names.index("node") < names.index("node/a") < names.index("node/a/x.service")
    assert stat.S_ISDIR(entries[names.index("node/a")].mode) and names.count("node") == 1


def test_the_node_initramfs_carries_the_units_and_changes_with_them(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(TOP / "scripts" / "vm"))
    vm_test = load("vm_test", TOP / "scripts" / "vm-test")
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    for name in vm_test.NODE_FILES:
        (node_dir / name).write_text(f"# {name}\n")
    monkeypatch.setattr(vm_test, "NODE_DIR", node_dir)
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF fake")
    monkeypatch.setattr(vm_test, "BUSYBOX", busybox)
    k = vm_test.kernel.Kernel(package="p", version="0", release="0", vmlinuz=tmp_path / "vmlinuz", modules=[])
    (tmp_path / "cache").mkdir()
    first = vm_test.build_initramfs(tmp_path / "cache", k)
    names = {e.name: e.data for e in initramfs.read_cpio(first.read_bytes())}
    assert names["node/husk-node.target"] == b"# husk-node.target\n" and "init.stage2" in names
    (node_dir / "masked").write_text("x.service\n")
    second = vm_test.build_initramfs(tmp_path / "cache", k)
    assert second != first and not first.exists()   # a changed unit set is a new archive; the old one goes


def test_paths_under_the_guests_tmpfs_are_bound_back(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(TOP / "scripts" / "vm"))
    vm_test = load("vm_test", TOP / "scripts" / "vm-test")
    got = vm_test.hidden_paths([Path("/tmp/ci/repo"), Path("/tmp/ci/repo/.venv"), Path("/srv/repo"),
                                Path("/run/x"), Path("/tmpfoo/y"), Path("/var/lib/husk/z")])
    assert got == ["/run/x", "/tmp/ci/repo", "/var/lib/husk/z"]


# --- vm-test's verdict, with a fake guest in place of qemu ------------------------------------------------
# The fake takes qemu's command line, finds the job share (-virtfs local,path=JOB,mount_tag=husk-job) and plays one
# outcome. Its pid goes to a file, so that a test can check the runner killed it (and kill it itself if not).

FAKE_QEMU = """#!/bin/sh
for a in "$@"; do
    case "$a" in
        local,path=*,mount_tag=husk-job*) job=${{a#local,path=}}; job=${{job%%,*}} ;;
    esac
done
echo $$ > {pid_file}
[ -f "$job/run" ] || {{ echo "fake qemu: no job script in $job" >&2; exit 3; }}
{body}
"""
HANG = 987654   # an unusual argument for sleep: the fake's process is recognisable by its command line


@pytest.fixture
def vm_test(monkeypatch, tmp_path: Path):
    """scripts/vm-test with the kernel and the initramfs stubbed (no apt, no build)."""
    monkeypatch.syspath_prepend(str(TOP / "scripts" / "vm"))
    module = load("vm_test", TOP / "scripts" / "vm-test")
    fake_kernel = module.kernel.Kernel(package="linux-image-fake", version="0", release="0-fake",
                                       vmlinuz=tmp_path / "vmlinuz", modules=[])
    monkeypatch.setattr(module.kernel, "fetch", lambda cache, wanted, package=None: fake_kernel)
    monkeypatch.setattr(module, "build_initramfs", lambda cache, k: tmp_path / "initrd.cpio")
    return module


@pytest.fixture
def fake_guest(tmp_path: Path):
    """fake_guest(shell body) -> the fake qemu's path; ends the fake's process afterwards if it still lives."""
    pid_file = tmp_path / "fake-qemu.pid"

    def make(body: str) -> str:
        path = tmp_path / "fake-qemu"
        path.write_text(FAKE_QEMU.format(pid_file=pid_file, body=body))
        path.chmod(0o755)
        return str(path)

    yield make
    pid = _fake_pid(pid_file)
    if pid is not None and _is_fake(pid):
        os.kill(pid, signal.SIGKILL)  # the fake this test started, by its pid


def _fake_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text())
    except (OSError, ValueError):
        return None


def _is_fake(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return str(HANG).encode() in f.read()
    except OSError:
        return False


def _run(vm_test, qemu: str, tmp_path: Path, *extra: str) -> int:
    return vm_test.main(["--qemu", qemu, "--python", sys.executable, "--cache", str(tmp_path / "cache"),
                         "--quiet", *extra, "-k", "nothing"])


@pytest.mark.parametrize("body", [
    f'echo "husk-vm: booted"; exec sleep {HANG}',                    # the job hangs
    f"exec >/dev/null 2>&1; exec sleep {HANG}",                      # the console closes, qemu lives on
], ids=["hung-job", "console-closed"])
def test_a_guest_past_the_time_limit_is_killed_and_fails(vm_test, fake_guest, tmp_path: Path, capsys,
                                                          body: str) -> None:
    assert _run(vm_test, fake_guest(body), tmp_path, "--timeout", "1") == vm_test.EXIT_TIMEOUT == 124
    pid = _fake_pid(tmp_path / "fake-qemu.pid")
    assert pid is not None and not _is_fake(pid), "the hung guest was left running"
    assert "FAILED: the guest did not finish within 1 s and was killed" in capsys.readouterr().err


@pytest.mark.parametrize("body", [
    'echo "husk-vm: booted"; exit 0',                                # powered off without a status
    "echo 'Kernel panic - not syncing'; exit 1",                     # panic=1 with -no-reboot ends qemu
    'echo "0" > "$job/exit-code.tmp"; exit 0',                       # the rename never happened
], ids=["no-status", "panic", "status-not-renamed"])
def test_a_guest_without_an_exit_code_file_fails_with_125(vm_test, fake_guest, tmp_path: Path, capsys,
                                                           body: str) -> None:
    assert _run(vm_test, fake_guest(body), tmp_path) == vm_test.EXIT_NO_STATUS == 125
    assert "without reporting the job's exit status" in capsys.readouterr().err


def test_an_unreadable_exit_code_fails_with_125(vm_test, fake_guest, tmp_path: Path, capsys) -> None:
    assert _run(vm_test, fake_guest('echo "passed?" > "$job/exit-code"'), tmp_path) == 125
    assert "unreadable exit status" in capsys.readouterr().err


@pytest.mark.parametrize("code", [0, 1, 5])
def test_the_jobs_exit_status_is_the_result(vm_test, fake_guest, tmp_path: Path, code: int) -> None:
    # the job script the guest would run names the selection
    body = f'grep -q -- "-k nothing" "$job/run" || exit 9; echo {code} > "$job/exit-code"; exit 0'
    assert _run(vm_test, fake_guest(body), tmp_path) == code


@pytest.mark.parametrize("code", [0, 3])
def test_the_node_guests_status_comes_back_the_same_way(vm_test, fake_guest, tmp_path: Path, code: int) -> None:
    body = (f'case "$*" in *husk.node=1*systemd.unit=husk-node.target*) ;; *) exit 9 ;; esac; '
            f'grep -q -- "tests/node" "$job/run" || exit 9; echo "husk-vm: booted"; echo {code} > "$job/exit-code"')
    assert vm_test.main(["--node", "--qemu", fake_guest(body), "--python", sys.executable,
                         "--cache", str(tmp_path / "cache"), "--quiet", "tests/node"]) == code


def test_a_missing_emulator_is_an_error_not_a_pass(vm_test, tmp_path: Path, capsys) -> None:
    assert _run(vm_test, str(tmp_path / "no-such-qemu"), tmp_path) == 2
    assert "--qemu" in capsys.readouterr().err
