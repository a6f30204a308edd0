"""The one-way imports between the three layers: cri_server -> shim -> runtime.

runtime/ (husk) never imports shim/ or cri_server/, and shim/ never imports cri_server/: checked statically
over every import statement of the package sources (function-local ones included, and importlib.import_module
/ __import__ with a literal name), then by importing every runtime and shim module in a fresh interpreter.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]

# package -> the packages it must never import
FORBIDDEN = {"runtime": ("shim", "cri_server"), "shim": ("cri_server",)}


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the module `module` (relative imports are
    resolved against it), at any depth."""
    out: list[tuple[int, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            out.append((node.lineno, prefix))
            out += [(node.lineno, f"{prefix}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(top: Path = TOP) -> list[str]:
    found = []
    for pkg, banned in FORBIDDEN.items():
        for path in sorted((top / pkg).rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(top).parts):
                continue
            module = ".".join(path.relative_to(top).with_suffix("").parts).removesuffix(".__init__")
            for line, name in imported_names(path.read_text(), module, path.name == "__init__.py"):
                if name.split(".")[0] in banned:
                    found.append(f"{path.relative_to(top)}:{line}: {pkg} imports {name}")
    return found


def test_no_layer_imports_upwards():
    assert violations() == []


@pytest.mark.parametrize("code, module, bad", [
    ("import shim.loop", "runtime.x", "shim.loop"),
    ("def f():\n    from cri_server.rpc import stats\n", "runtime.cgroups.v1", "cri_server.rpc"),
    ("class C:\n    if True:\n        import cri_server.store as st\n", "shim.pb.x", "cri_server.store"),
    ("import importlib\nimportlib.import_module('cri_server.daemon')", "shim.spawner", "cri_server.daemon"),
])
def test_the_check_sees_every_kind_of_import(code, module, bad):
    assert bad in [name for _, name in imported_names(code, module, False)]


def test_relative_imports_resolve_within_the_package():
    assert [n for _, n in imported_names("from .v2 import V2Manager", "runtime.cgroups.v1", False)] == \
        ["runtime.cgroups.v2", "runtime.cgroups.v2.V2Manager"]
    assert [n for _, n in imported_names("from . import v1", "runtime.cgroups", True)] == \
        ["runtime.cgroups", "runtime.cgroups.v1"]


def test_a_violation_is_reported(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "shim").mkdir()
    (tmp_path / "runtime" / "ok.py").write_text("import os\nfrom runtime import errors\n")
    (tmp_path / "shim" / "bad.py").write_text("def f():\n    import cri_server.store\n")
    assert violations(tmp_path) == ["shim/bad.py:2: shim imports cri_server.store"]


def test_importing_runtime_and_shim_loads_no_upper_layer():
    """Every module of runtime/ (then of shim/) imported in a fresh interpreter: none pulls in a layer above
    (modules that need an optional dependency missing here are skipped)."""
    code = """
import importlib, pkgutil, sys
sys.path.insert(0, sys.argv[1])
for pkg, banned in (("runtime", ("shim", "cri_server")), ("shim", ("cri_server",))):
    top = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(top.__path__, pkg + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    bad = sorted(m for m in sys.modules if m.split(".")[0] in banned)
    if bad:
        print(pkg, "loads", " ".join(bad))
        sys.exit(1)
"""
    r = subprocess.run([sys.executable, "-c", code, str(TOP)], capture_output=True, text=True, timeout=120,
                       cwd=TOP, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
