"""husk's log records have runc's shape (logrus): JSON lines with sorted keys, or text key=value records."""
from __future__ import annotations

import json
import os
import re

import pytest

from runtime import cli, logutil

@pytest.fixture(autouse=True)
def _reset_sink():
    yield
    logutil._sink = None  # the CLI configures a process-wide sink; other tests run in this process too


TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)$")


def test_json_record_matches_runc() -> None:
    line = logutil.format_record("error", "container does not exist", "json")
    # runc: {"level":"error","msg":"container does not exist","time":"2026-11-30T00:31:08Z"}
    assert line.startswith('{"level":"error","msg":"container does not exist","time":"')
    rec = json.loads(line)
    assert list(rec) == ["level", "msg", "time"] and TIME.match(rec["time"])


def test_json_escapes_like_go() -> None:
    line = logutil.format_record("error", 'exec: "<a&b>"\n', "json")
    assert "<" not in line and "&" not in line and "\\u003c" in line
    assert json.loads(line)["msg"] == 'exec: "<a&b>"\n'


def test_text_record_matches_runc() -> None:
    line = logutil.format_record("error", "container does not exist", "text")
    m = re.match(r'time="([^"]+)" level=error msg="container does not exist"$', line)
    assert m and TIME.match(m.group(1))
    # logrus leaves values of safe characters unquoted
    assert logutil.format_record("warning", "plain-word_1.2/x", "text").endswith("level=warning msg=plain-word_1.2/x")
    assert logutil.format_record("error", 'say "hi"', "text").endswith('msg="say \\"hi\\""')


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_error_goes_to_log_file_and_bare_message_to_stderr(tmp_path, capsys, fmt: str) -> None:
    log = tmp_path / "log"
    g = cli.Globals(log=str(log), log_format=fmt)
    assert cli.guard(g, lambda: (_ for _ in ()).throw(cli.HuskError("boom happened"))) == 1
    assert capsys.readouterr().err == "boom happened\n"
    content = log.read_text()
    assert content.count("\n") == 1 and "boom happened" in content
    if fmt == "json":
        assert json.loads(content)["level"] == "error"
    # appended, never truncated (containerd reads the last error of a file the runtime shares)
    cli.guard(g, lambda: (_ for _ in ()).throw(cli.HuskError("second")))
    assert log.read_text().count("\n") == 2


def test_without_log_file_the_record_goes_to_stderr(capsys) -> None:
    g = cli.Globals(log_format="json")
    assert cli.guard(g, lambda: (_ for _ in ()).throw(OSError(2, "No such file or directory", "/x")), 255) == 255
    err = capsys.readouterr().err
    assert json.loads(err)["msg"] == "No such file or directory: /x"


def test_warnings_and_debug_follow_the_sink(tmp_path) -> None:
    log = tmp_path / "log"
    logutil.configure(str(log), "json", debug=False)
    try:
        logutil.warning("hook %s failed", "poststop", container_id="c1")
        logutil.debug("not shown", container_id="c1")
        logutil.configure(str(log), "json", debug=True)
        logutil.debug("shown %d", 1, container_id="c1")
    finally:
        logutil._sink = None
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(r["level"], r["msg"]) for r in recs] == [("warning", "hook poststop failed"), ("debug", "shown 1")]


def test_log_file_opened_append_only(tmp_path) -> None:
    log = tmp_path / "log"
    log.write_text("old\n")
    os.chmod(log, 0o600)
    logutil.configure(str(log), "text")
    try:
        logutil.emit("info", "x")
    finally:
        logutil._sink = None
    assert log.read_text().startswith("old\n")
