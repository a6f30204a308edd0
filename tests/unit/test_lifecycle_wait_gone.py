"""runtime.lifecycle._wait_gone reads the init's /proc/<pid>/stat once: a reap between two reads raised TypeError."""
import subprocess

from runtime import lifecycle
from runtime import state as st
from tests.support.waiting import wait_for


class _Rec:
    def __init__(self, pid: int, pid_start: int) -> None:
        self.id = "c1"
        self.pid = pid
        self.pid_start = pid_start


def test_a_process_reaped_between_reads_is_not_an_error(monkeypatch) -> None:
    child = subprocess.Popen(["true"])
    try:
        start = st.proc_stat(child.pid)[1]
        wait_for(lambda: st.proc_stat(child.pid)[0] == "Z", 10, "the child to exit")
        answers = [("Z", start), None]   # the second read would see it reaped

        def fake(pid: int):
            return answers.pop(0) if answers else None

        monkeypatch.setattr(st, "proc_stat", fake)
        lifecycle._wait_gone(_Rec(child.pid, start), timeout=5)   # the exited child's pidfd is readable at once
        assert answers == [None], "proc_stat must be read once"
    finally:
        child.wait()
