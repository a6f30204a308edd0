"""The `husk-cri images` click group (no root: an empty root, help, errors) and the progress bar."""
from __future__ import annotations

import io

from click.testing import CliRunner

from cri_server.cli import main as husk_cri
from cri_server.images.cli import ProgressBar, images
from cri_server.images.pull import Progress


def test_group_is_mounted_and_options_follow_the_subcommand(tmp_path):
    r = CliRunner().invoke(husk_cri, ["images", "ls", "--root", str(tmp_path), "--registry-config-dir",
                                      str(tmp_path / "none")])
    assert r.exit_code == 0, r.output
    assert r.output.split() == ["IMAGE", "TAG", "IMAGE", "ID", "SIZE"]
    assert (tmp_path / "images" / "meta.db").exists()
    for cmd in ("pull", "import", "export", "ls", "rm", "gc"):
        h = CliRunner().invoke(images, [cmd, "--help"])
        assert h.exit_code == 0 and "--root" in h.output and "--registry-config-dir" in h.output


def test_errors_are_one_line(tmp_path):
    r = CliRunner().invoke(images, ["pull", "Not/Valid", "--root", str(tmp_path)])
    assert r.exit_code == 1 and "invalid image reference 'Not/Valid': repository name must be lowercase" in r.output
    r = CliRunner().invoke(images, ["rm", "busybox", "--root", str(tmp_path)])
    assert r.exit_code == 1 and "no such image: busybox" in r.output
    assert "Traceback" not in r.output


def test_progress_bar():
    out = io.StringIO()
    bar = ProgressBar(out, width=10)
    bar(Progress("r", "resolved", total=200_000_000))
    bar.last = 0  # redraws are throttled to 10 per second
    bar(Progress("r", "bytes", "a", 100_000_000, 150_000_000))
    bar.last = 0
    bar(Progress("r", "bytes", "b", 50_000_000, 50_000_000))
    bar(Progress("r", "unpacked", "b"))
    bar(Progress("r", "done"))
    lines = out.getvalue().split("\r")
    assert lines[-1] == "r: [#######---]  150.0/200.0 MB, 1 layers unpacked\n"
    assert "[#####-----]  100.0/200.0 MB" in lines[2]
