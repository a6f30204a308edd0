"""The spawner's preparation before its first fork (shim/spawner.py): the dry run of a shim in the zygote
(`_warm_up`) and the filling of pymalloc's free blocks (`_fill_pool_holes`). No root needed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a fresh process: the warm-up changes (and must put back) process-wide state. Prints what it left.
HARNESS = r"""
import json, os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)       # as _zygote_main sets it
from shim import log as shim_log, spawner
fds = sorted(os.listdir("/proc/self/fd"))
comm_before = open("/proc/self/comm").read().strip()
ok = spawner._warm_up()
children = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rpartition(")")[2].split()[1]) == os.getpid():
                    children.append(int(p))
        except (OSError, ValueError):
            pass
with open("/proc/self/status") as f:
    status = dict(line.split(":", 1) for line in f if ":" in line)
print(json.dumps({
    "ok": ok, "fds_before": fds, "fds_after": sorted(os.listdir("/proc/self/fd")), "children": children,
    "threads": threading.active_count(), "tasks": len(os.listdir("/proc/self/task")),
    "sigchld": int(signal.getsignal(signal.SIGCHLD)), "sigterm": int(signal.getsignal(signal.SIGTERM)),
    "sigint": int(signal.getsignal(signal.SIGINT)), "sigalrm": int(signal.getsignal(signal.SIGALRM)),
    "wakeup_fd": signal.set_wakeup_fd(-1), "comm_before": comm_before,
    "comm": open("/proc/self/comm").read().strip(),
    "log_prefix": shim_log._state["prefix"], "tmp": os.listdir(os.environ["TMPDIR"]),
}))
"""


def _run(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", HARNESS, TOP], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def test_warm_up_runs_a_shim_through_its_calls_and_leaves_nothing_behind(tmp_path):
    out, err = _run(tmp_path)
    assert out["ok"] is True, err          # every call of the dry run answered (the client exited 0)
    assert err == "", err                  # the dry run's log lines are not husk-cri's
    assert out["tmp"] == []                # its directory, socket, CRI log, stand-in runtime: removed
    assert out["fds_after"] == out["fds_before"]
    assert out["children"] == []           # the client and the stand-in containers reaped
    assert out["threads"] == 1 and out["tasks"] == 1
    assert (out["sigchld"], out["sigterm"], out["sigint"], out["sigalrm"]) == (0, 0, 1, 0)  # DFL, DFL, IGN, DFL
    assert out["wakeup_fd"] == -1
    assert out["comm"] == out["comm_before"]    # the dry run never renames the zygote (no "husk-shim" either)
    assert out["log_prefix"] == "husk-shim"


NO_DIR = """
def _no_dir(*a, **k):
    raise OSError(28, "No space left on device")
spawner._private_dir = _no_dir
"""


def test_warm_up_failure_is_one_warning_and_leaves_nothing_behind(tmp_path):
    """A dry run that cannot run (here its directory cannot be made) is skipped with one line on stderr; the
    zygote goes on as before."""
    code = HARNESS.replace("ok = spawner._warm_up()", NO_DIR + "ok = spawner._warm_up()")
    p = subprocess.run([sys.executable, "-c", code, TOP], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is False
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "warm-up skipped" in lines[0], p.stderr
    assert out["children"] == [] and out["fds_after"] == out["fds_before"] and out["threads"] == 1
    assert (out["sigchld"], out["sigterm"], out["sigint"]) == (0, 0, 1)


def test_a_failing_client_does_not_end_the_zygote(tmp_path):
    """The dry run's client signals the zygote (SIGTERM) when a call fails; the zygote put SIGTERM back to its
    default action before ending the client, so a late signal killed the zygote. Here the stand-in runtime
    cannot run (as on a noexec TMPDIR): the zygote must survive, warn once and leave nothing."""
    code = HARNESS.replace("ok = spawner._warm_up()",
                           'spawner._WARM_RUNTIME = "#!/nonexistent/interpreter\\n"\nok = spawner._warm_up()')
    p = subprocess.run([sys.executable, "-c", code, TOP], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr            # -15 (SIGTERM) when the zygote died
    out = json.loads(p.stdout)
    assert out["ok"] is False and "warm-up" in p.stderr
    assert out["tmp"] == [] and out["children"] == [] and out["fds_after"] == out["fds_before"]


def test_a_planted_directory_in_tmpdir_is_left_alone(tmp_path):
    """The dry run's directory had a guessable name (husk-spawner-warm-<pid>) that was emptied first: a
    symlink planted there made root delete another directory's contents. Now it is a fresh private directory."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    # the next pids: the harness's own is one of them on a quiet machine
    base = os.getpid()
    for pid in range(base, base + 200):
        os.symlink(victim, tmpdir / f"husk-spawner-warm-{pid}")
    code = HARNESS.replace('os.listdir(os.environ["TMPDIR"])', "[]")
    p = subprocess.run([sys.executable, "-c", code, TOP], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmpdir)})
    assert p.returncode == 0, p.stderr
    assert (victim / "keep").exists()
    assert len(os.listdir(tmpdir)) == 200        # the planted links untouched, nothing of ours left


def test_filler_blocks_have_the_size_of_their_class():
    from shim.spawner import _block
    for size in range(16, 513, 16):
        got = sys.getsizeof(_block(size, 7))
        assert size - 16 < got <= size, (size, got)


def test_fill_pool_holes_takes_the_free_blocks():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from shim import spawner;"
            "before = spawner._pool_free_blocks(); keep = spawner._fill_pool_holes();"
            "after = spawner._pool_free_blocks();"
            "print(sum(before.values()), len(keep), sum(after.values()))")
    p = subprocess.run([sys.executable, "-I", "-S", "-c", code, TOP], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"})
    assert p.returncode == 0, p.stderr
    before, taken, after = map(int, p.stdout.split())
    assert before > 0                       # the stats were read (pymalloc's table parsed)
    assert taken >= before
    assert after < before


def test_warm_up_with_a_failing_runtime_is_one_warning_and_leaves_nothing_behind(tmp_path):
    """The stand-in runtime cannot run (a missing interpreter): Create fails, the client ends serve() and the
    zygote says why in one line, instead of waiting for the dry run's alarm."""
    code = HARNESS.replace("ok = spawner._warm_up()",
                           "spawner._WARM_RUNTIME = '#!/nonexistent/sh\\n'\nok = spawner._warm_up()")
    p = subprocess.run([sys.executable, "-c", code, TOP], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is False
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "warm-up incomplete" in lines[0] and "no Shutdown" not in lines[0], p.stderr
    assert out["tmp"] == [] and out["children"] == [] and out["fds_after"] == out["fds_before"]
    assert out["threads"] == 1 and (out["sigchld"], out["sigterm"], out["sigint"]) == (0, 0, 1)


def test_the_zygote_imports_no_module_with_an_at_fork_hook(tmp_path):
    """threading, logging and random register os.register_at_fork hooks, which run in every forked child:
    imported in the zygote, they ran in every shim and wrote objects all over its shared pages (-0.15 MB
    private per shim without them; shim/README.md, "Memory")."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from shim import spawner; spawner._preload(()); "
            "ok = spawner._warm_up(); "
            "print(ok, sorted(m for m in ('threading', 'logging', 'random') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-I", "-S", "-c", code, TOP], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "[]"], (p.stdout, p.stderr)


# The code a dry run runs, packed (`_warm_up_packed`): how many pages its code objects span before and after,
# and that every function stays reachable as before (same object from its module and its class).
PACKED = r"""
import gc, signal, sys, types
sys.path.insert(0, sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
from shim import spawner
spawner._preload(())

def ran():
    seen = {}
    def note(frame, event, arg):
        if event == "call":
            seen[id(frame.f_code)] = frame.f_code
    sys.setprofile(note)
    ok = spawner._warm_up()
    sys.setprofile(None)
    assert ok
    return list(seen.values())

def pages(codes):
    return len({p for c in codes for p in range(id(c) // 4096, (id(c) + sys.getsizeof(c) - 1) // 4096 + 1)})

before = pages(ran())
keep = spawner._warm_up_packed()
after_codes = ran()
from shim import service, ttrpc_server
same = (service.TaskService.__dict__["Create"] is getattr(service.TaskService, "Create")
        and ttrpc_server.listen_unix is sys.modules["shim.ttrpc_server"].__dict__["listen_unix"])
print(before, pages(after_codes), len(keep) > 0, same)
"""


def test_warm_up_packed_puts_the_code_a_shim_runs_on_fewer_pages(tmp_path):
    p = subprocess.run([sys.executable, "-I", "-S", "-c", PACKED, TOP], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    before, after, filled, same = p.stdout.split()
    assert int(after) < int(before) * 0.7, p.stdout     # measured: ~150 -> ~60 pages
    assert (filled, same) == ("True", "True")


def test_pack_functions_moves_only_functions_held_by_module_and_class_dicts():
    import types
    import weakref
    from shim import spawner

    mod = types.ModuleType("husk_pack_probe")
    exec("def f(x):\n    return x + 1\n"
         "def g(x):\n    return x * 2\n"
         "class C:\n    def m(self):\n        return 'm'\n", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        held_elsewhere = [mod.g]                # a reference no dict scan sees: g must stay
        old_f, old_m = weakref.ref(mod.f), weakref.ref(mod.C.__dict__["m"])
        moved = spawner._pack_functions([mod.f, mod.g, mod.C.__dict__["m"]])
        assert moved == 2
        assert old_f() is None and old_m() is None      # the originals, no longer held anywhere, are gone
        assert mod.f(1) == 2 and mod.f.__qualname__ == "f" and mod.f.__module__ == "husk_pack_probe"
        assert mod.C().m() == "m" and mod.C.m.__qualname__ == "C.m"
        assert mod.g is held_elsewhere[0]
    finally:
        del sys.modules[mod.__name__]
