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


# --- inside cri_server: no reads of another module's private names; the task layer does not import RPCs ---
# module -> the packages it must never import (the RPC layer passes callbacks down instead)
FORBIDDEN_INSIDE = {"cri_server.tasks": ("cri_server.rpc",), "cri_server.recovery": ("cri_server.rpc",)}
_PROJECT = ("runtime", "shim", "cri_server")


def _module_of(path: Path, top: Path) -> str:
    return ".".join(path.relative_to(top).with_suffix("").parts).removesuffix(".__init__")


def module_aliases(tree: ast.AST, module: str, is_package: bool, top: Path = TOP) -> dict[str, str]:
    """Local name -> project module, for every name an import binds to a module of the project."""
    out: dict[str, str] = {}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for a in node.names:
                full = f"{prefix}.{a.name}"
                p = top.joinpath(*full.split("."))
                if p.with_suffix(".py").exists() or (p / "__init__.py").exists():
                    out[a.asname or a.name] = full
    return {k: v for k, v in out.items() if v.split(".")[0] in _PROJECT}


def private_reads(source: str, module: str, is_package: bool = False, top: Path = TOP) -> list[tuple[int, str]]:
    """(line, what) of every `m._name` where m is another project module bound by an import, and of every
    `store._name` / `x.store._name` (the metadata Store's private fields) outside cri_server.store."""
    tree = ast.parse(source)
    aliases = module_aliases(tree, module, is_package, top)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        v = node.value
        if isinstance(v, ast.Name) and aliases.get(v.id, module) != module:
            out.append((node.lineno, f"{v.id}.{node.attr} of {aliases[v.id]}"))
        elif ((isinstance(v, ast.Name) and v.id == "store") or (isinstance(v, ast.Attribute) and v.attr == "store")) \
                and not module.startswith("cri_server.store"):
            out.append((node.lineno, f"the Store's {node.attr}"))
    return out


def inner_violations(top: Path = TOP) -> list[str]:
    found = []
    for path in sorted((top / "cri_server").rglob("*.py")):
        rel = path.relative_to(top)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts) or rel.parts[:2] == ("cri_server", "api"):
            continue
        module = _module_of(path, top)
        source = path.read_text()
        found += [f"{rel}:{line}: reads {what}" for line, what in private_reads(source, module, path.name == "__init__.py", top)]
        banned = FORBIDDEN_INSIDE.get(module, ())
        found += [f"{rel}:{line}: {module} imports {name}"
                  for line, name in imported_names(source, module, path.name == "__init__.py")
                  if any(name == b or name.startswith(b + ".") for b in banned)]
    return found


def test_no_cri_server_module_reads_private_names_or_imports_the_rpc_layer_from_below():
    assert inner_violations() == []


@pytest.mark.parametrize("code", [
    "from cri_server.store import store as st\nst._from_row(1)",
    "from cri_server.rpc import sandbox_status\nsandbox_status._items.check_room()",
    "import cri_server.offline as off\noff._records()",
    "def f(svc):\n    return svc.store._sandboxes.get('x')",
    "def f(store):\n    return store._containers",
])
def test_the_private_read_check_sees(code):
    assert private_reads(code, "cri_server.tasks") != []


def test_the_private_read_check_allows_own_and_foreign_privates():
    code = "import os\n_x = 1\ndef f(self):\n    os._exit(self._y + _x)\n"
    assert private_reads(code, "cri_server.daemon") == []


def test_an_inner_violation_is_reported(tmp_path):
    (tmp_path / "cri_server" / "rpc").mkdir(parents=True)
    (tmp_path / "cri_server" / "rpc" / "__init__.py").write_text("")
    (tmp_path / "cri_server" / "rpc" / "events.py").write_text("_x = 1\n")
    (tmp_path / "cri_server" / "tasks.py").write_text("def f():\n    from cri_server.rpc import events\n    return events._x\n")
    assert inner_violations(tmp_path) == [
        "cri_server/tasks.py:3: reads events._x of cri_server.rpc.events",
        "cri_server/tasks.py:2: cri_server.tasks imports cri_server.rpc",
        "cri_server/tasks.py:2: cri_server.tasks imports cri_server.rpc.events",
    ]
