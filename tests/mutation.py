"""``make mutate``: the mutants of named modules, run against the tests that cover them.

Specification
-------------
``python tests/mutation.py MODULE [MODULE ...] [--jobs N]`` runs mutmut (the ``[dev]``
extra, pinned: this file reads its result files) on each module in turn:

1. **The tests that cover a module** are the test files of ``tests/`` that import it
   (``import rescue.sim.grid``, ``from rescue.sim import grid``, ``from rescue.sim.grid
   import ...``), or those ``tests/mutation.toml`` lists for it under ``[tests]`` (a module
   that long end-to-end tests import names its focused ones). Among them mutmut runs, for
   each mutant, the tests that called the mutated function.
2. **A work folder** ``build/mutate/<module>/`` holds a link to every top-level entry of the
   repository and a ``pyproject.toml`` that names the module to mutate; mutmut copies it all
   into ``mutants/`` there and runs the tests from that copy (``PYTHONPATH`` points a test's
   subprocess at the mutated copy too). Nothing of the repository is written. The folder is
   made anew each run.
3. **The result**: every mutant is ``killed`` (a test failed, timed out or crashed), or
   ``survived`` (every test passed, or no test called its function), or ``equivalent``: a
   survivor ``tests/mutation.toml`` lists under ``[[equivalent]]`` (its module, function,
   original and mutated text, and why no test can tell them apart). The score is killed /
   (mutants − equivalent); each survivor is printed with its ``file:line`` and its change.
   An entry of the list that matches no mutant, or matches a killed one, is an error (the
   list follows the code, or the claim of equivalence was wrong).

Exit status 0 when every module's score is at least ``THRESHOLD``, 1 when one is below it
or the list of equivalents is stale, 2 on bad input (one line naming ``MODULES``).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rescue import interrupts

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
#: The score every module must reach: killed / non-equivalent mutants.
THRESHOLD = 0.85
#: The list of equivalent mutants and of extra covering tests.
LIST = ROOT / "tests" / "mutation.toml"
#: Top-level entries of the repository the work folder does not link.
NOT_LINKED = {".git", ".venv", ".venv-rehearsal", "build", "runs", "site", "wandb", "mutants"}
#: What mutmut's exit codes mean here (mutmut.stats.status_by_exit_code, grouped): a test
#: failed (1, 3), timed out (24, 36, 152, 255, -24) or the run was killed (-9, -11).
KILLED_CODES = {1, 3, -24, 24, 36, 152, 255, -11, -9}
#: Every test passed (0, 5: none collected) or no test called the function (33).
SURVIVED_CODES = {0, 5, 33}
#: pytest arguments of every mutant's run: the newcomer's tier, no cache written, and the
#: plugin ``PLUGIN`` (written beside the mutated copy as ``mutant_tests.py``).
PYTEST_ARGS = ["-m", "not slow and not agent", "-p", "no:cacheprovider", "-p", "mutant_tests"]


class Refused(Exception):
    """Bad input: one line naming what is wrong and what is allowed."""


@dataclass(frozen=True)
class Mutant:
    """One mutant of a module and what the tests made of it."""

    name: str
    status: str  # killed | survived | equivalent
    function: str  # ``name`` or ``Class.name``
    line: int  # in the original file (0: unknown)
    original: str  # the changed lines as they were, stripped, joined by newlines
    mutated: str  # the same lines in the mutant
    why: str = ""  # equivalent: the reason the list gives
    no_test: bool = False  # survived because no test called the function


@dataclass(frozen=True)
class Equivalent:
    """An entry of ``[[equivalent]]`` in ``tests/mutation.toml``."""

    module: str
    function: str
    original: str
    mutated: str
    why: str

    def matches(self, module: str, m: Mutant) -> bool:
        return (self.module, self.function, self.original, self.mutated) == (
            module,
            m.function,
            m.original,
            m.mutated,
        )


# ── input ───────────────────────────────────────────────────────────────────────────────


def check_modules(modules: list[str], root: Path = ROOT) -> list[str]:
    """The named modules as paths relative to ``root``; ``Refused`` naming the first that
    is not a Python file of a package at the top of ``root`` (``rescue/``, ``filters/``,
    ``swe_smith_tasks/``)."""
    if not modules:
        raise Refused("MODULES is empty: name the modules to mutate, e.g. MODULES=rescue/flags.py")
    out = []
    for m in modules:
        rel = Path(os.path.relpath(Path(m).resolve(), root)) if Path(m).is_absolute() else Path(m)
        top = root / rel.parts[0]
        if (
            rel.suffix != ".py"
            or len(rel.parts) < 2
            or rel.parts[0] == "tests"
            or not (top / "__init__.py").is_file()
            or not (root / rel).is_file()
        ):
            raise Refused(
                f"MODULES: {m}: allowed a Python file of a package of the repository (rescue/, "
                "filters/, swe_smith_tasks/), as a path from its top, e.g. rescue/flags.py"
            )
        out.append(rel.as_posix())
    return out


def dotted(module: str) -> str:
    """``rescue/sim/grid.py`` -> ``rescue.sim.grid`` (a package's ``__init__`` is the package)."""
    parts = list(Path(module).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str) -> set[str]:
    """Every module a Python source imports, by dotted name (``from a import b``: ``a`` and
    ``a.b``, since ``b`` may be a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def load_list(path: Path = LIST) -> tuple[dict[str, list[str]], list[Equivalent]]:
    """``tests/mutation.toml``: extra covering tests per module, and the equivalents."""
    if not path.is_file():
        return {}, []
    data = tomllib.loads(path.read_text())
    extra = {k: list(v) for k, v in data.get("tests", {}).items()}
    eqs = []
    for n, e in enumerate(data.get("equivalent", []), 1):
        # a mutant that deletes the text is printed `-> ''`: its mutated text may be empty
        missing = [
            k
            for k in ("module", "function", "original", "mutated", "why")
            if k not in e or (k != "mutated" and not e[k])
        ]
        if missing:
            raise Refused(f"{path}: [[equivalent]] {n}: missing {', '.join(missing)}")
        eqs.append(
            Equivalent(
                e["module"], e["function"], e["original"].strip(), e["mutated"].strip(), e["why"]
            )
        )
    return extra, eqs


def covering_tests(module: str, root: Path = ROOT, listed: list[str] = ()) -> list[str]:
    """The test files (``tests/...``) that import ``module``, or ``listed`` when given;
    ``Refused`` naming a listed file that does not exist."""
    for t in listed:
        if not (root / t).is_file():
            raise Refused(f"tests/mutation.toml: [tests] {module}: {t}: no such test file")
    if listed:
        return sorted(listed)
    name = dotted(module)
    return sorted(
        f"tests/{p.name}"
        for p in (root / "tests").glob("test_*.py")
        if name in imported(p.read_text())
    )


# ── the run ─────────────────────────────────────────────────────────────────────────────


def top_level(root: Path) -> list[str]:
    """The repository's top-level entries the work folder links (tracked by git, or every
    entry but ``NOT_LINKED`` and caches outside a git checkout)."""
    r = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    names = {line.split("/")[0] for line in r.stdout.splitlines()} if r.returncode == 0 else set()
    if not names:
        names = {p.name for p in root.iterdir()}
    return sorted(
        n
        for n in names
        if n not in NOT_LINKED
        and (root / n).exists()
        and not n.endswith(".egg-info")
        and n != "__pycache__"
    )


def prepare(
    work: Path, module: str, tests: list[str], root: Path = ROOT, fresh: bool = True
) -> None:
    """The work folder of one module (module docstring, 2.); ``fresh=False`` keeps mutmut's
    copy and results (``--survivors``)."""
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    entries = top_level(root)
    for name in entries:
        if name != "pyproject.toml" and not (work / name).is_symlink():
            (work / name).symlink_to(root / name)
    package = Path(module).parts[0]
    config = {
        "source_paths": [f"{package}/"],
        "only_mutate": [module],
        "also_copy": [f"{n}" for n in entries if n not in (package, "pyproject.toml")],
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": PYTEST_ARGS,
        # the stats, the clean run and each mutant in a process of its own, forked from one
        # that only collected the tests: no test's state reaches another phase's
        "process_isolation": "forkserver",
    }
    text = (root / "pyproject.toml").read_text()
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    (work / "pyproject.toml").write_text(text + "\n".join(lines) + "\n")


#: Imported by every Python a test starts with the mutated copy on its path: while mutmut
#: records which tests call which function, a test's subprocess (a command, a worker) runs
#: the functions plainly (mutmut's recorder would look for its settings in the subprocess's
#: folder, and the calls it records there are lost anyway); a mutant's name it keeps, so the
#: mutant runs in the subprocess too.
SITECUSTOMIZE = """import os
if os.environ.get("MUTANT_UNDER_TEST") in ("stats", "list_all_tests", "mutant_generation"):
    os.environ["MUTANT_UNDER_TEST"] = ""
"""


#: A pytest plugin in every run of mutmut's (the stats, the clean run, each mutant):
#:
#: - a mutant's tests run fastest first, by the durations mutmut recorded (its fork server
#:   runs them in the order of a set; with ``-x`` the first failure ends the run, so a slow
#:   test run first costs its minute for every mutant a quick one kills);
#: - the tests run under the signal settings of a plain ``pytest``: the fork server's
#:   process, which each mutant's is forked from, ignores SIGINT, answers SIGTERM with an
#:   exit of status 0 (which mutmut reads as "every test passed") and writes to its own
#:   pipe on SIGCHLD; a mutant that signals the test's own process must end it as it would
#:   end ``make test``.
PLUGIN = '''"""make mutate's plugin (tests/mutation.py, PLUGIN): fastest first, plain signals."""
import json
import signal
from pathlib import Path


def pytest_configure(config):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def pytest_collection_modifyitems(session, config, items):
    stats = Path("mutmut-stats.json")
    if not stats.is_file():
        return
    took = json.loads(stats.read_text()).get("duration_by_test", {})
    items.sort(key=lambda item: took.get(item.nodeid, float("inf")))
'''


def forget_survivors(work: Path, module: str) -> int:
    """Mark the mutants of ``module`` that survived the last run in ``work`` as not run, so
    that mutmut runs them again and keeps the other verdicts; how many (0: no earlier run).
    mutmut itself runs every mutant again when the covering test files changed."""
    meta = work / "mutants" / f"{module}.meta"
    if not meta.is_file():
        return 0
    data = json.loads(meta.read_text())
    codes = data["exit_code_by_key"]
    again = [k for k, v in codes.items() if v is None or v in SURVIVED_CODES]
    for k in again:
        codes[k] = None
    meta.write_text(json.dumps(data, indent=4))
    return len(again)


def run_mutmut(work: Path, jobs: int) -> int:
    """mutmut's run in ``work`` (its progress on this terminal) of every mutant not yet run
    there; its exit status."""
    # the folder exists before Python starts: a path entry missing at start is never searched
    (work / "mutants").mkdir(exist_ok=True)
    (work / "mutants" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (work / "mutants" / "mutant_tests.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(work / "mutants")}
    env.pop("MUTANT_UNDER_TEST", None)
    return subprocess.call(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
        cwd=work,
        env=env,
    )


# ── the result ──────────────────────────────────────────────────────────────────────────


def function_of(name: str) -> str:
    """``rescue.output.xǁStagingǁcommit__mutmut_3`` -> ``Staging.commit``."""
    mangled = name.partition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("x_"):
        return mangled[2:]
    _, cls, func = mangled.split("ǁ")
    return f"{cls}.{func}"


def def_line(source: str, function: str) -> int:
    """The line of ``def NAME`` of ``function`` (``name`` or ``Class.name``) in ``source``."""
    *cls, name = function.split(".")
    scope = ast.parse(source).body
    if cls:
        scope = next(n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == cls[0])
    node = next(
        n
        for n in scope
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
    )
    return node.lineno


def change(original: str, mutated: str, function: str, source: str) -> tuple[int, str, str]:
    """Where the mutant differs from the original function (their code as mutmut renders
    them): the line in the file (``source``), the original lines and the mutated ones."""
    a, b = original.splitlines(), mutated.splitlines()
    ops = [
        op
        for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
        if op[0] != "equal"
    ]
    if not ops:
        return 0, "", ""
    _, i1, i2, j1, j2 = ops[0]
    name = function.rpartition(".")[2]
    at = next(
        i for i, x in enumerate(a) if x.lstrip().startswith((f"def {name}(", f"async def {name}("))
    )
    line = def_line(source, function) + (i1 - at)
    was = "\n".join(x.strip() for x in a[i1 : max(i2, i1 + 1)])
    now = "\n".join(x.strip() for x in b[j1:j2])
    return line, was, now


def results(work: Path, module: str, equivalents: list[Equivalent]) -> list[Mutant]:
    """Every mutant of ``module`` in ``work`` (after ``run_mutmut``), classified."""
    meta = json.loads((work / "mutants" / f"{module}.meta").read_text())
    codes: dict[str, int | None] = meta["exit_code_by_key"]
    source = (work / module).read_text()
    old = Path.cwd()
    os.chdir(work)  # mutmut's readers take paths from the work folder
    try:
        import libcst as cst
        from mutmut.mutation.diff_apply import read_functions_from_index

        out = []
        for name, code in sorted(codes.items(), key=lambda kv: _order(kv[0])):
            function = function_of(name)
            pair = read_functions_from_index(name, module)
            line, was, now = 0, "", ""
            if pair is not None:
                orig, mut = (cst.Module([f]).code for f in pair)
                line, was, now = change(orig, mut, function, source)
            status = (
                "killed"
                if code in KILLED_CODES
                else "survived"
                if code in SURVIVED_CODES or code is None
                else "killed"
            )
            m = Mutant(name, status, function, line, was, now, no_test=code == 33)
            if status == "survived":
                eq = next((e for e in equivalents if e.matches(module, m)), None)
                if eq is not None:
                    m = Mutant(name, "equivalent", function, line, was, now, why=eq.why)
            out.append(m)
        return out
    finally:
        os.chdir(old)


def _order(name: str) -> tuple[str, int]:
    stem, _, n = name.rpartition("__mutmut_")
    return stem, int(n) if n.isdigit() else 0


def stale(module: str, mutants: list[Mutant], equivalents: list[Equivalent]) -> list[str]:
    """The entries for ``module`` that match no mutant, or only killed ones (errors)."""
    out = []
    for e in equivalents:
        if e.module != module:
            continue
        hits = [m for m in mutants if e.matches(module, m)]
        if not hits:
            out.append(
                f"{module}: {e.function}: {e.original!r} -> {e.mutated!r}: no such mutant "
                "(the code changed): remove it from tests/mutation.toml"
            )
        elif all(m.status == "killed" for m in hits):
            out.append(
                f"{module}: {e.function}: {e.original!r} -> {e.mutated!r}: killed by the "
                "tests, so not equivalent: remove it from tests/mutation.toml"
            )
    return out


@dataclass(frozen=True)
class Score:
    module: str
    mutants: int
    killed: int
    equivalent: int
    survived: int
    seconds: float

    @property
    def score(self) -> float:
        counted = self.mutants - self.equivalent
        return self.killed / counted if counted else 1.0

    def row(self) -> str:
        return (
            f"| `{self.module}` | {self.mutants} | {self.killed} | {self.equivalent} | "
            f"{self.survived} | {100 * self.score:.1f}% | {_duration(self.seconds)} |"
        )


def score(module: str, mutants: list[Mutant], seconds: float) -> Score:
    n = {s: sum(m.status == s for m in mutants) for s in ("killed", "survived", "equivalent")}
    return Score(module, len(mutants), n["killed"], n["equivalent"], n["survived"], seconds)


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def report(module: str, mutants: list[Mutant]) -> list[str]:
    """The survivors of ``module``, one line each: ``file:line function: original -> mutant``."""
    lines = []
    for m in mutants:
        if m.status != "survived":
            continue
        why = " (no test calls it)" if m.no_test else ""
        lines.append(
            f"{module}:{m.line}: {m.function}{why}: {m.original!r} -> {m.mutated!r}  [{m.name}]"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make mutate", description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (MODULES)")
    parser.add_argument(
        "--jobs",
        default=str(os.cpu_count() or 1),
        help="mutants tested at once (MUTATE_JOBS; default the cores)",
    )
    parser.add_argument(
        "--root",
        default=str(ROOT),
        help="the repository (default this one; the tests run a fixture's)",
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run again only the mutants that survived the module's last run, keeping the "
        "other verdicts (while writing the tests that kill them; default off: every mutant)",
    )
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    try:
        modules = check_modules(
            [m for a in args.modules for m in a.replace(",", " ").split()], root
        )
        jobs = int(args.jobs) if args.jobs.strip().isdigit() else 0
        if jobs < 1:
            raise Refused(f"MUTATE_JOBS={args.jobs}: allowed an integer >= 1")
        extra, equivalents = load_list(root / LIST.relative_to(ROOT))
        plan = {m: covering_tests(m, root, extra.get(m, [])) for m in modules}
        bare = [m for m, t in plan.items() if not t]
        if bare:
            raise Refused(
                f"MODULES: {bare[0]}: no test file imports it (or tests/mutation.toml "
                "[tests] lists one): nothing can kill its mutants"
            )
    except Refused as e:
        print(f"make mutate: error: {e}", file=sys.stderr)
        return 2
    try:
        with interrupts.handled():
            return run_all(plan, equivalents, root, jobs, args.survivors)
    except KeyboardInterrupt as e:  # mutmut's processes were ended first
        print(f"make mutate: interrupted by {interrupts.signal_name(e)}", file=sys.stderr)
        return interrupts.exit_status(e)


def run_all(
    plan: dict[str, list[str]],
    equivalents: list[Equivalent],
    root: Path,
    jobs: int,
    survivors: bool = False,
) -> int:
    """Each module of ``plan`` in turn (module docstring); the exit status."""
    scores, errors = [], []
    for module, tests in plan.items():
        print(f"== {module}: mutants run against {', '.join(tests)}", flush=True)
        work = root / "build" / "mutate" / dotted(module)
        start = time.monotonic()
        again = forget_survivors(work, module) if survivors else 0
        prepare(work, module, tests, root, fresh=not again)
        if again:
            print(f"== {module}: the {again} survivors of its last run, again", flush=True)
        rc = run_mutmut(work, jobs)
        if rc != 0 or not (work / "mutants" / f"{module}.meta").is_file():
            errors.append(f"{module}: mutmut exited {rc} (its output above)")
            continue
        mutants = results(work, module, equivalents)
        s = score(module, mutants, time.monotonic() - start)
        scores.append(s)
        errors += stale(module, mutants, equivalents)
        survivors = report(module, mutants)
        print(
            f"== {module}: {s.killed} of {s.mutants - s.equivalent} non-equivalent mutants "
            f"killed ({100 * s.score:.1f}%), {s.equivalent} equivalent, {_duration(s.seconds)}"
        )
        for line in survivors:
            print(f"   survived: {line}")
    print()
    print("| module | mutants | killed | equivalent | survived | score | time |")
    print("|---|---|---|---|---|---|---|")
    for s in scores:
        print(s.row())
    low = [s for s in scores if s.score < THRESHOLD]
    for s in low:
        errors.append(f"{s.module}: {100 * s.score:.1f}% killed, below {100 * THRESHOLD:.0f}%")
    for e in errors:
        print(f"make mutate: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
