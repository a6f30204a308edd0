"""The config schema: the committed generated validator is current, and it rejects every bad config that
jsonschema (the reference implementation) rejects, with the JSON path in the error."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from runtime import config
from runtime.errors import ConfigError
from runtime.schema import generate
from runtime.spec import default_spec

SCHEMA = json.loads(Path(generate.SCHEMA).read_text())


def test_generated_validator_is_up_to_date() -> None:
    assert Path(generate.OUTPUT).read_text() == generate.generate(), \
        "runtime/schema/validator.py is stale: run scripts/gen-schema-validator"


def test_schema_is_valid_draft7() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def _set(cfg: dict, path: str, value: object) -> dict:
    cfg = copy.deepcopy(cfg)
    cur = cfg
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
    last = keys[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    elif value is _DELETE:
        del cur[last]
    else:
        cur[last] = value
    return cfg


_DELETE = object()
BASE = default_spec()

BAD = [
    ("ociVersion", 1), ("ociVersion", "2.0.0"), ("ociVersion", "1.0"), ("ociVersion", _DELETE),
    ("root", "rootfs"), ("root.path", 5), ("root.readonly", "yes"),
    ("hostname", 7), ("mounts", {}), ("mounts.0.destination", _DELETE), ("mounts.0.options", "ro"),
    ("mounts.0.options", [1]), ("process.cwd", _DELETE), ("process.args", "sh"), ("process.env", [3]),
    ("process.terminal", "true"), ("process.user.uid", -1), ("process.user.gid", 2**32),
    ("process.user.additionalGids", [-5]), ("process.user.umask", "022"),
    ("process.capabilities.bounding", ["chown"]), ("process.capabilities.ambient", "CAP_KILL"),
    ("process.rlimits.0.type", "NOFILE"), ("process.rlimits.0.soft", -1), ("process.rlimits.0.hard", _DELETE),
    ("process.oomScoreAdj", 1001), ("process.oomScoreAdj", "5"), ("process.noNewPrivileges", 1),
    ("process.consoleSize", {"height": 1}), ("process.scheduler", {"policy": "SCHED_NOPE"}),
    ("process.ioPriority", {"class": "IOPRIO_CLASS_BE", "priority": 8}),
    ("linux.namespaces.0.type", "bogus"), ("linux.namespaces.0", {"path": "/x"}), ("linux.namespaces", {}),
    ("linux.uidMappings", [{"containerID": 0, "hostID": 1}]), ("linux.gidMappings", [{"containerID": -1,
                                                                                      "hostID": 1, "size": 1}]),
    ("linux.devices", [{"path": "/dev/x", "type": "q"}]), ("linux.devices", [{"type": "c"}]),
    ("linux.devices", [{"path": "/dev/x", "type": "c", "fileMode": 70000}]),
    ("linux.resources.devices.0.access", "rwx"), ("linux.resources.devices.0.allow", "no"),
    ("linux.resources.devices.0.type", "z"),
    ("linux.resources.memory", {"limit": "1G"}), ("linux.resources.memory", {"swappiness": -2}),
    ("linux.resources.cpu", {"shares": -1}), ("linux.resources.cpu", {"cpus": 0}),
    ("linux.resources.pids", {"limit": "max"}), ("linux.resources.blockIO", {"weight": 5}),
    ("linux.resources.blockIO", {"throttleReadBpsDevice": [{"major": 8, "minor": 0}]}),
    ("linux.resources.hugepageLimits", [{"pageSize": "2M", "limit": 1}]),
    ("linux.resources.network", {"classID": -1}), ("linux.resources.unified", {"memory.max": 5}),
    ("linux.rootfsPropagation", "rshared"), ("linux.cgroupsPath", 5), ("linux.sysctl", {"a": 1}),
    ("linux.maskedPaths", "/proc"), ("linux.readonlyPaths", [1]),
    ("linux.seccomp", {"syscalls": [{"names": [], "action": "SCMP_ACT_ALLOW"}]}),
    ("linux.seccomp", {"syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW",
                                     "args": [{"index": 0, "value": 1, "op": "EQ"}]}]}),
    ("hooks.prestart", [{"args": ["x"]}]), ("hooks.poststop", [{"path": "/x", "timeout": 0}]),
    ("annotations", {"a": 1}), ("linux.timeOffsets", {"monotonic": {"secs": "1"}}),
    ("linux.personality", {"domain": "WINDOWS"}),
]


@pytest.mark.parametrize("path,value", BAD, ids=[f"{p}={v!r}"[:60] for p, v in BAD])
def test_generated_rejects_what_jsonschema_rejects(path: str, value: object) -> None:
    cfg = _set(BASE, path, value)
    ref_errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(cfg))
    assert ref_errors, "the reference validator accepts this config: not a bad input"
    with pytest.raises(ConfigError) as info:
        config.check_schema(cfg)
    # the error names a JSON path that leads to (or contains) one that jsonschema reports
    ref_paths = {".".join(str(p) for p in e.absolute_path) for e in ref_errors}
    got = info.value.path.replace("[", ".").replace("]", "")
    assert any(r.startswith(got) or got.startswith(r) for r in ref_paths), (got, ref_paths)


@pytest.mark.parametrize("version", ["1.0.0", "1.0.2-dev", "1.1.0+dev", "1.2.1", "1.3.0", "1.10.0"])
def test_every_1x_version_is_accepted_by_both(version: str) -> None:
    cfg = _set(BASE, "ociVersion", version)
    jsonschema.validate(cfg, SCHEMA)
    config.check_schema(cfg)


def test_default_spec_is_valid_for_both() -> None:
    jsonschema.validate(BASE, SCHEMA)
    config.check_schema(BASE)
    config.check(BASE, "/nonexistent-bundle", require_rootfs=False)


def test_error_message_names_path_and_reason() -> None:
    with pytest.raises(ConfigError) as info:
        config.check_schema(_set(BASE, "linux.namespaces.2.type", "bogus"))
    assert info.value.path == "linux.namespaces[2].type"
    assert str(info.value).startswith("config.json: linux.namespaces[2].type: must be one of")


def test_runtime_path_does_not_import_jsonschema_or_fastjsonschema() -> None:
    import subprocess
    import sys
    code = ("import sys, runtime.config as c, runtime.spec as s; c.check_schema(s.default_spec()); "
            "print(sorted(m for m in sys.modules if 'jsonschema' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_regex_free_matchers_agree_with_re() -> None:
    import random
    import re
    from runtime.schema import validator
    samples = ["", "a", "b", "abc", "rw", "rwm", "rwmr", "c", "u", "p", "x", "0", "1", "0,1-3", "0-1 ,", "1a",
               "RLIMIT_NOFILE", "RLIMIT_", "RLIMIT_nofile", "RLIMIT_NO_FILE", "CAP_SYS_ADMIN", "CAP_", "CAP_x",
               "2MB", "1GB", "0MB", "10KB", "1TB", "MB", "2MB\n", "1.0.0", "1.0.2-dev", "1.1.0+dev", "1.2.1-rc.1+b.2",
               "1.01.0", "1.0", "2.0.0", "1.0.0-", "1.0.0+", "1.10.200", "1.0.0-a+b-c", "1.0.0\n", "\n", "\n\n",
               "CAP_A\n", "é", "1.0.0-é", "a\n"]
    rng = random.Random(7)
    alphabet = "abcrwmup0123456789,- .+_RLIMTCAPKGBNOFSYDé\n"
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(3000)]
    samples += ["1." + "".join(rng.choice("0123456789.-+abc") for _ in range(rng.randint(0, 8))) for _ in range(3000)]
    for pattern, matcher in validator.REGEX_PATTERNS.items():
        ref = re.compile(pattern.replace("$", r"\Z") if pattern.endswith("$") else pattern)
        for s in samples:
            assert bool(matcher.search(s)) == bool(ref.search(s)), (pattern, s)
