"""husk-cri's config: defaults, the TOML file, flags over the file, precise errors."""
from __future__ import annotations

import tomllib

import pytest
from click.testing import CliRunner

from cri_server import config as cfg
from cri_server.cli import main


def test_printed_defaults_parse_back_to_the_defaults():
    text = cfg.to_toml(cfg.Config())
    assert cfg.from_mapping(tomllib.loads(text)) == cfg.Config()


def test_cli_prints_defaults():
    out = CliRunner().invoke(main, ["config", "default"])
    assert out.exit_code == 0, out.output
    doc = tomllib.loads(out.output)
    assert doc["server"]["listen"] == "/run/husk/cri.sock"
    assert doc["server"]["socket_mode"] == "0660"
    assert doc["cni"]["bin_dirs"] == ["/opt/cni/bin", "/usr/lib/cni"]
    # Every field of every section is printed.
    for section in ("server", "paths", "runtime", "cni", "registry", "streaming"):
        assert set(doc[section]) == set(cfg.to_dict(cfg.Config())[section])


def test_file_then_flags(tmp_path):
    f = tmp_path / "cri.toml"
    f.write_text('[paths]\nroot = "/srv/husk"\n[cni]\nbin_dirs = ["/x"]\nconf_dir = "/etc/x"\n')
    out = CliRunner().invoke(main, ["--config", str(f), "--cni-bin-dir", "/a", "--cni-bin-dir", "/b",
                                    "--listen", "unix:///run/t.sock", "--log-level", "debug",
                                    "--sandbox-image", "local/pause:1", "--runtime", "runc",
                                    "--registry-config-dir", "/etc/r", "--stream-address", "127.0.0.2",
                                    "--state", "/run/t", "config", "show"])
    assert out.exit_code == 0, out.output
    doc = tomllib.loads(out.output)
    assert doc["paths"] == {"root": "/srv/husk", "state": "/run/t"}
    assert doc["cni"]["bin_dirs"] == ["/a", "/b"]          # the flag replaces the file's list
    assert doc["cni"]["conf_dir"] == "/etc/x"              # untouched by flags
    assert doc["server"]["listen"] == "unix:///run/t.sock"
    assert doc["server"]["log_level"] == "debug"
    assert doc["runtime"]["sandbox_image"] == "local/pause:1"
    assert doc["runtime"]["runtime"] == "runc"
    assert doc["registry"]["config_dir"] == "/etc/r"
    assert doc["streaming"]["address"] == "127.0.0.2"


def test_socket_path_forms():
    for listen in ("/run/x.sock", "unix:///run/x.sock", "unix:/run/x.sock"):
        c = cfg.with_overrides(cfg.Config(), {"listen": listen})
        assert c.socket_path == "/run/x.sock"


@pytest.mark.parametrize("text,key", [
    ('[srever]\nlisten = "/x"\n', "srever"),
    ('[server]\nlisten = 5\n', "server.listen"),
    ('[server]\nlistn = "/x"\n', "server.listn"),
    ('[server]\nsocket_mode = "999"\n', "server.socket_mode"),
    ('[server]\nlisten = "relative.sock"\n', "server.listen"),
    ('[cni]\nbin_dirs = "/opt/cni/bin"\n', "cni.bin_dirs"),
    ('[cni]\nbin_dirs = ["relative"]\n', "cni.bin_dirs"),
    ('[runtime]\nrestrict_oom_score_adj = "maybe"\n', "runtime.restrict_oom_score_adj"),
    ('[runtime]\ncgroup_driver = "systemdd"\n', "runtime.cgroup_driver"),
    ('[runtime]\ncgroup_driver = "cgroupfs"\nsystemd_cgroup = true\n', "runtime.cgroup_driver"),
    ('[runtime]\ncgroup_driver = "systemd"\nsystemd_cgroup = false\n', "runtime.cgroup_driver"),
    ('[runtime]\nsystemd_cgroup = "true"\n', "runtime.systemd_cgroup"),
    ('[runtime]\ntolerate_missing_hugetlb_controller = 1\n', "runtime.tolerate_missing_hugetlb_controller"),
    ('[runtime.handlers]\n"" = "runc"\n', "runtime.handlers"),
    ('[paths]\nroot = "var/lib"\n', "paths.root"),
    ('[server]\nlog_level = "verbose"\n', "server.log_level"),
    ('[streaming]\ntls_cert_file = "/c.pem"\n', "streaming.tls_key_file"),
    ('[streaming]\ntls_key_file = "/k.pem"\n', "streaming.tls_cert_file"),
    ('[streaming]\ntls_ca_file = "/ca.pem"\n', "streaming.tls_ca_file"),
    ('[streaming]\ntls_cert_file = "c.pem"\ntls_key_file = "/k.pem"\n', "streaming.tls_cert_file"),
])
def test_invalid_file(tmp_path, text, key):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(str(f))
    assert e.value.key == key
    assert str(f) in str(e.value)


def test_not_toml(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[server\n")
    with pytest.raises(cfg.ConfigError, match="not valid TOML"):
        cfg.load(str(f))


def test_bad_flag_is_a_usage_error():
    out = CliRunner().invoke(main, ["--listen", "relative.sock", "config", "show"])
    assert out.exit_code == 2
    assert "server.listen" in out.output


def test_streaming_tls_keys(tmp_path):
    doc = tomllib.loads(CliRunner().invoke(main, ["config", "default"]).output)
    assert {k: doc["streaming"][k] for k in ("tls_cert_file", "tls_key_file", "tls_ca_file")} == \
        {"tls_cert_file": "", "tls_key_file": "", "tls_ca_file": ""}
    assert not cfg.Config().streaming.tls
    f = tmp_path / "c.toml"
    f.write_text('[streaming]\ntls_cert_file = "/etc/husk/s.pem"\ntls_key_file = "/etc/husk/s.key"\n')
    c = cfg.load(str(f))
    assert c.streaming.tls and c.streaming.tls_key_file == "/etc/husk/s.key" and not c.streaming.tls_ca_file
    out = CliRunner().invoke(main, ["--config", str(f), "--stream-tls-ca", "/etc/husk/ca.pem",
                                    "--stream-tls-cert", "/x/c.pem", "config", "show"])
    assert out.exit_code == 0, out.output
    st = tomllib.loads(out.output)["streaming"]
    assert (st["tls_cert_file"], st["tls_key_file"], st["tls_ca_file"]) == \
        ("/x/c.pem", "/etc/husk/s.key", "/etc/husk/ca.pem")
    out = CliRunner().invoke(main, ["--stream-tls-key", "/x/k.pem", "config", "show"])
    assert out.exit_code == 2 and "streaming.tls_cert_file" in out.output


def test_handlers_table(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[runtime.handlers]\nrunc = "/usr/bin/runc"\ncrun = "crun"\n')
    assert cfg.load(str(f)).runtime.handlers == {"runc": "/usr/bin/runc", "crun": "crun"}


@pytest.mark.parametrize("name,level", [("warn", "WARNING"), ("WARNING", "WARNING"), ("trace", "DEBUG"),
                                        ("info", "INFO"), ("fatal", "CRITICAL")])
def test_log_levels_as_containerd_and_crio_spell_them(tmp_path, name, level):
    import io
    import logging

    from cri_server import logs
    f = tmp_path / "c.toml"
    f.write_text(f'[server]\nlog_level = "{name}"\n')
    c = cfg.load(str(f))
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        logs.setup(c.server.log_level, "text", io.StringIO())
        assert logging.getLevelName(root.level) == level
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[1]:
            root.addHandler(h)
        root.setLevel(saved[0])
    out = CliRunner().invoke(main, ["--log-level", name, "config", "show"])
    assert out.exit_code == 0, out.output


def test_cgroup_driver_defaults_and_printed():
    c = cfg.Config()
    assert c.runtime.systemd_cgroup is False and c.runtime.cgroup_driver == "cgroupfs"
    assert c.runtime.tolerate_missing_hugetlb_controller is True
    doc = tomllib.loads(CliRunner().invoke(main, ["config", "default"]).output)
    assert doc["runtime"]["systemd_cgroup"] is False
    assert doc["runtime"]["tolerate_missing_hugetlb_controller"] is True
    assert "cgroup_driver" not in doc["runtime"]           # one source of truth: systemd_cgroup


def test_systemd_cgroup_from_file_and_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[runtime]\nsystemd_cgroup = true\ntolerate_missing_hugetlb_controller = false\n")
    c = cfg.load(str(f))
    assert c.runtime.systemd_cgroup and c.runtime.cgroup_driver == "systemd"
    assert not c.runtime.tolerate_missing_hugetlb_controller
    out = CliRunner().invoke(main, ["--config", str(f), "--no-systemd-cgroup", "config", "show"])
    assert out.exit_code == 0, out.output
    assert tomllib.loads(out.output)["runtime"]["systemd_cgroup"] is False
    out = CliRunner().invoke(main, ["--systemd-cgroup", "config", "show"])
    assert tomllib.loads(out.output)["runtime"]["systemd_cgroup"] is True
    out = CliRunner().invoke(main, ["config", "show"])
    assert tomllib.loads(out.output)["runtime"]["systemd_cgroup"] is False


@pytest.mark.parametrize("text,systemd", [
    ('cgroup_driver = "cgroupfs"\n', False),                  # what old files say: still loads
    ('cgroup_driver = "systemd"\n', True),
    ('cgroup_driver = "systemd"\nsystemd_cgroup = true\n', True),
    ('cgroup_driver = "cgroupfs"\nsystemd_cgroup = false\n', False),
])
def test_old_cgroup_driver_key_is_the_same_option(tmp_path, text, systemd):
    f = tmp_path / "c.toml"
    f.write_text("[runtime]\n" + text)
    c = cfg.load(str(f))
    assert c.runtime.systemd_cgroup is systemd
    assert "cgroup_driver" not in cfg.to_toml(c)


def test_contradicting_driver_keys_say_which(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[runtime]\ncgroup_driver = "cgroupfs"\nsystemd_cgroup = true\n')
    with pytest.raises(cfg.ConfigError, match="'cgroupfs' contradicts runtime.systemd_cgroup = true"):
        cfg.load(str(f))
