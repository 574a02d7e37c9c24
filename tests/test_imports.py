"""What the core imports: never an adapter, a framework or a heavy library at import time.

The core is ``rescue/`` minus ``rescue/miles`` and ``rescue/slime``. Every import statement
of every core module is read from its source (including those inside functions):

- none names an adapter (``rescue.miles``, ``rescue.slime``), ``filters``,
  ``swe_smith_tasks`` or a training framework, its inference engine or its runtime;
- at module level, only the standard library, numpy and other core modules;
- inside functions, other libraries may be imported where they are used (torch and
  transformers in ``rescue.replay``, matplotlib and wandb in ``rescue.sim``, scipy and
  matplotlib in ``rescue.judge``).

Then every core module is imported in a fresh interpreter and ``sys.modules`` is checked.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Adapters (and the rehearsal's Miles side, which patches Miles in-process): they import their
#: framework, lazily.
ADAPTERS = ("rescue.miles", "rescue.slime", "rescue.rehearsal.miles")
#: Never imported by the core, at module level or inside a function.
FORBIDDEN = (
    *ADAPTERS,
    "filters",
    "swe_smith_tasks",
    "miles",
    "miles_plugins",
    "slime",
    "sglang",
    "megatron",
    "docker",
    "minisweagent",
    "swesmith",
    "swebench",
)
#: Runtimes a core module may import only inside a function, and only in these modules.
LAZY_ONLY = {"ray": ("rescue.sim.cluster",)}
#: Third-party packages a core module may import at module level.
MODULE_LEVEL_THIRD_PARTY = ("numpy",)
#: Not loaded by importing the whole core.
NOT_LOADED = (*FORBIDDEN, *LAZY_ONLY, "torch", "transformers", "matplotlib", "wandb", "scipy")


def core_modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "rescue").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.startswith(ADAPTERS) or name == "rescue.__main__":
            continue
        names.append(name)
    return names


def _under(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def imports_of(module: str) -> list[tuple[str, bool, int]]:
    """``(imported module, at module level, line)`` for every import in ``module``'s source."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text(), str(path))
    out = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((a.name, top, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against this module's package
                    pkg = module.split(".")
                    pkg = pkg if path.name == "__init__.py" else pkg[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join([*pkg, base] if base else pkg)
                out.extend((f"{base}.{a.name}", top, child.lineno) for a in child.names)
                out.append((base, top, child.lineno))
            inner = top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            visit(child, inner)

    visit(tree, True)
    return out


def test_the_core_is_what_the_walk_reads():
    mods = core_modules()
    assert {"rescue", "rescue.samples", "rescue.census", "rescue.sim.engine"} <= set(mods)
    assert not any(_under(m, ADAPTERS) for m in mods)


@pytest.mark.parametrize("module", core_modules())
def test_a_core_module_imports_no_adapter_and_no_framework(module):
    bad = [(name, line) for name, _, line in imports_of(module) if _under(name, FORBIDDEN)]
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", core_modules())
def test_ray_is_imported_only_inside_the_functions_that_run_on_a_cluster(module):
    for runtime, allowed in LAZY_ONLY.items():
        found = [(n, top, line) for n, top, line in imports_of(module) if _under(n, (runtime,))]
        assert not [f for f in found if f[1]], f"{module} imports {runtime} at module level"
        assert not found or module in allowed, f"{module} imports {runtime} at {found}"


def test_the_ray_runner_is_where_the_walk_finds_ray():
    found = [(n, top) for n, top, _ in imports_of("rescue.sim.cluster") if n == "ray"]
    assert found and not any(top for _, top in found)


@pytest.mark.parametrize("module", core_modules())
def test_a_core_module_imports_only_stdlib_numpy_and_the_core_at_module_level(module):
    core = set(core_modules())
    bad = []
    for name, top, line in imports_of(module):
        head = name.split(".")[0]
        if not top or name == "__future__" or head in sys.stdlib_module_names:
            continue
        if head in MODULE_LEVEL_THIRD_PARTY or name in core or name.rpartition(".")[0] in core:
            continue
        bad.append((name, line))
    assert not bad, f"{module} imports at module level {bad}"


def test_the_walk_sees_imports_inside_functions():
    """The walk must not miss a lazy import: rescue.replay.model imports torch in a function."""
    found = [(n, top) for n, top, _ in imports_of("rescue.replay.model") if n == "torch"]
    assert found and not any(top for _, top in found)


def test_importing_the_whole_core_loads_no_framework_and_no_heavy_library():
    code = (
        "import importlib, json, sys\n"
        f"for m in {core_modules()!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    import json

    loaded = json.loads(out.stdout)
    assert not [m for m in loaded if _under(m, NOT_LOADED)]


def test_the_version_is_written_once():
    """``rescue.__version__`` is the version; pyproject reads it (no second copy)."""
    import importlib.metadata

    import rescue

    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    assert not [x for x in lines if x.replace(" ", "").startswith('version="')]
    assert 'version = { attr = "rescue.__version__" }' in lines
    assert importlib.metadata.version("rescue") == rescue.__version__
