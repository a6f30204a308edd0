"""ExecSync through husk-shim: output, exit codes, the 16 MiB cap, and timeouts that kill the exec's whole
process group but never the container."""
from __future__ import annotations

import pytest

from cri_server.streaming.execsync import ExecSyncTimeout, exec_sync
from shim import ttrpc_wire
from shim.pb import task_types
from tests.shim_fixtures import runtimes_available
from tests.streaming_support.harness import run
from tests.streaming_support.shim_pods import MARK, assert_no_leaks, start_container, stop_container
from tests.support import procfs

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=runtimes_available())
def box(request, tmp_path_factory):
    c = start_container(str(tmp_path_factory.mktemp("hstrm-execsync")), ["sleep", "100000"], runtime=request.param)
    yield c
    stop_container(c)


def test_exec_sync_output_and_exit_code(box):
    async def main():
        r = await exec_sync(box.shim.address, box.cid, ["sh", "-c", "echo -n hello; echo oops >&2; exit 4"])
        assert (r.stdout, r.stderr, r.exit_code) == (b"hello", b"oops\n", 4)
        r = await exec_sync(box.shim.address, box.cid, ["sh", "-c", "echo $HSTRM_MARK; pwd"], timeout=30)
        assert r.stdout.decode().splitlines() == [MARK.split("=", 1)[1], "/tmp"] and r.exit_code == 0
        await assert_no_leaks(box)
    run(main)


def test_exec_sync_caps_each_stream(box):
    async def main():
        r = await exec_sync(box.shim.address, box.cid,
                            ["sh", "-c", "head -c 300000 /dev/zero; head -c 5000 /dev/zero >&2"], max_output=100000)
        assert len(r.stdout) == 100000 and r.stdout_truncated
        assert len(r.stderr) == 5000 and not r.stderr_truncated
        assert r.exit_code == 0
        await assert_no_leaks(box)
    run(main)


def test_exec_sync_timeout_kills_the_process_group_only(box):
    """critest's rule: after a timeout the command is gone, the container still runs. Here the command
    also started a background child: it goes with it (the exec's process group is killed)."""
    async def main():
        with pytest.raises(ExecSyncTimeout):
            await exec_sync(box.shim.address, box.cid, ["sh", "-c", "sleep 4321 & sleep 4322"], timeout=1)
        await assert_no_leaks(box)  # the init alone: both sleeps are dead
        assert not procfs.live_with_args("sleep 4321", "sleep 4322")
        assert box.status() == task_types.Status.RUNNING
    run(main)


def test_exec_sync_in_a_stopped_container_is_a_shim_error(tmp_path, box):
    c = start_container(str(tmp_path), ["true"], runtime=box.shim.runtime)
    try:
        async def main():
            from tests.streaming_support.shim_pods import wait_until
            await wait_until(lambda: c.status() == task_types.Status.STOPPED, "the container to exit")
            with pytest.raises(ttrpc_wire.TtrpcError) as exc:
                await exec_sync(c.shim.address, c.cid, ["true"])
            assert exc.value.code == ttrpc_wire.FAILED_PRECONDITION
            assert not c.leftover_execs()
        run(main)
    finally:
        stop_container(c)

