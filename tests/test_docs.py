"""The documentation: every setting and make variable documented in exactly one page, the
site's navigation complete, the README a front page, and the docs' CPU commands run.

Conventions the docs follow (docs/development.md states them for whoever edits a page):

- **The documenting entry** of a setting or make variable ``NAME`` is a body row of a
  Markdown table whose first cell holds `` `NAME` `` (alone or with other names, e.g.
  `` `A` / `B` ``). Exactly one such row exists across ``docs/*.md``; any page may mention
  or link to it elsewhere.
- **The settings that must be documented** are derived from the sources, never listed here:
  every ``RESCUE_*`` name that the Python code of ``rescue/``, ``filters/`` and
  ``swe_smith_tasks/`` reads (a string literal that is exactly the name: the key of an
  ``os.environ`` / ``env`` lookup or the constant it is held in), every ``RESCUE_*`` a
  launcher reads with a default (``${RESCUE_NAME:-...}``), and every make variable the
  Makefile takes (``user_variables``: assigned with ``?=``, or read but never assigned in
  the Makefile; a name assigned with ``=`` or ``:=`` is internal).
- **Executed command blocks**: a fenced block right after a line ``<!-- cpu-test -->`` (or
  ``<!-- cpu-test timeout=N -->``, seconds, default 120) is run by bash (``-e -o pipefail``)
  with this Python's ``bin`` first on ``PATH`` (so ``rescue`` is the installed one), in a
  fresh folder that links every top-level entry of the repository except ``runs/``,
  ``site/`` and ``wandb/`` (so what a command writes stays there).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_launch_inputs import user_variables

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

# ── what the sources read ────────────────────────────────────────────────────────────────

PY_LITERAL = re.compile(r"""["'](RESCUE_[A-Z0-9_]*[A-Z0-9])["']""")
SH_DEFAULTED = re.compile(r"\$\{(RESCUE_[A-Z0-9_]*[A-Z0-9]):?[-=]")


def settings_read(root: Path = ROOT) -> dict[str, set[str]]:
    """Each ``RESCUE_*`` setting the code reads -> the files that read it."""
    found: dict[str, set[str]] = {}
    for folder in ("rescue", "filters", "swe_smith_tasks"):
        for path in (root / folder).rglob("*.py"):
            for name in PY_LITERAL.findall(path.read_text()):
                found.setdefault(name, set()).add(str(path.relative_to(root)))
    for path in (root / "launch").glob("*.sh"):
        for name in SH_DEFAULTED.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(root)))
    return found


# ── what the docs define ─────────────────────────────────────────────────────────────────

FENCE = re.compile(r"^\s*(```|~~~)")
NAME_IN_CELL = re.compile(r"`([A-Z][A-Z0-9_]*)`")


def table_body_first_cells(text: str) -> list[tuple[int, str]]:
    """(line number, first cell) of every body row of every table outside code fences."""
    lines = text.splitlines()
    cells, in_fence = [], False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or not line.lstrip().startswith("|"):
            continue
        if re.fullmatch(r"\s*\|[\s:|-]+\|?\s*", line):
            continue  # the separator row
        if i + 1 < len(lines) and re.fullmatch(r"\s*\|[\s:|-]+\|?\s*", lines[i + 1]):
            continue  # the header row
        first = line.strip().strip("|").split("|")[0]
        cells.append((i + 1, first))
    return cells


def definitions(pages: list[Path] = PAGES) -> dict[str, list[str]]:
    """NAME -> the places (``page:line``) of its documenting entries."""
    found: dict[str, list[str]] = {}
    for page in pages:
        for line, cell in table_body_first_cells(page.read_text()):
            for name in NAME_IN_CELL.findall(cell):
                found.setdefault(name, []).append(f"{page.name}:{line}")
    return found


def required() -> set[str]:
    return set(settings_read()) | user_variables()


def coverage_problems(pages: list[Path] = PAGES) -> list[str]:
    """What is wrong with the docs' coverage, one line per name (empty when all is well)."""
    text = "\n".join(p.read_text() for p in pages)
    defined = definitions(pages)
    problems = []
    for name in sorted(required()):
        if not re.search(rf"\b{name}\b", text):
            problems.append(f"{name}: missing from the docs pages")
        elif name not in defined:
            problems.append(f"{name}: mentioned, but no page has its table row `{name}`")
        elif len(defined[name]) > 1:
            problems.append(f"{name}: documented more than once: {', '.join(defined[name])}")
    return problems


def test_the_collectors_find_what_the_sources_read():
    # Guards against a collector that finds nothing (the coverage test would then pass).
    read = settings_read()
    assert {"RESCUE_ARM", "RESCUE_SWE_TRIAL_TIMEOUT", "RESCUE_SC_TOP_K", "RESCUE_DOCKER"} <= set(
        read
    )
    assert "launch/config.sh" in read["RESCUE_DOCKER"]
    assert {"PYTEST_ARGS", "RUN_DIR", "TORCH"} <= user_variables()
    # Internal Makefile names (assigned with := or =) are not settings.
    assert not {"PY", "PIP", "Q_ARGS", "SWE_CLI_DEPS"} & user_variables()


def test_every_setting_and_make_variable_is_documented_in_exactly_one_page():
    assert coverage_problems() == []


def test_the_coverage_check_names_a_removed_entry_and_a_second_one(tmp_path):
    """Ignoring an entry fails: a page without RESCUE_KAPPA's row, and one with two rows."""
    copies = []
    for page in PAGES:
        copy = tmp_path / page.name
        text = page.read_text()
        if page.name == "miles.md":
            text = "\n".join(
                line for line in text.splitlines() if not line.startswith("| `RESCUE_KAPPA` |")
            )
        if page.name == "arms.md":
            text += "\n\n| name | meaning |\n|---|---|\n| `RUN_DIR` | again |\n"
        copy.write_text(text)
        copies.append(copy)
    problems = coverage_problems(copies)
    assert "RESCUE_KAPPA: mentioned, but no page has its table row `RESCUE_KAPPA`" in problems
    assert any(p.startswith("RUN_DIR: documented more than once: ") for p in problems)
    assert len(problems) == 2


def test_a_header_row_is_not_a_definition():
    text = "| `ARM` | the arm |\n|---|---|\n| `zero` | R = 0 |\n| `SEED` / `A` | x |\n"
    assert table_body_first_cells(text) == [(3, " `zero` "), (4, " `SEED` / `A` ")]


# ── the site ─────────────────────────────────────────────────────────────────────────────


def nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M)


def test_the_navigation_lists_every_page_once():
    listed = nav_pages()
    assert sorted(listed) == sorted(p.name for p in PAGES)
    assert len(listed) == len(set(listed))


def test_the_docs_target_builds_strictly_into_site():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs: \$\(VENV\)/\.stamp-docs\n\t.*mkdocs build --strict", makefile, re.M)
    assert "site/" in (ROOT / ".gitignore").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("\nmake lint\n") < ci.index("\nmake docs\n")


def test_the_readme_is_a_front_page_that_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for command in ("make demo", "make test", "make q1", "make q2", "make q3"):
        assert command in readme
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert linked == {p.name for p in PAGES} - {"index.md"}


# ── the docs' command blocks that run on a CPU ───────────────────────────────────────────

MARKER = re.compile(r"^<!-- cpu-test(?: timeout=(\d+))? -->\s*$")


def cpu_blocks() -> list[tuple[str, str, int]]:
    """(``page:line``, the block's text, timeout) of every marked block."""
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            match = MARKER.match(line)
            if not match:
                continue
            start = i + 1
            if start >= len(lines) or not lines[start].startswith("```"):
                raise AssertionError(f"{page.name}:{i + 1}: a cpu-test marker not before a fence")
            end = next(j for j in range(start + 1, len(lines)) if lines[j].startswith("```"))
            body = "\n".join(lines[start + 1 : end])
            blocks.append((f"{page.name}:{start + 1}", body, int(match.group(1) or 120)))
    return blocks


BLOCKS = cpu_blocks()


def test_the_docs_have_executed_blocks():
    assert len(BLOCKS) >= 5
    pages = {where.split(":")[0] for where, _, _ in BLOCKS}
    assert {"getting-started.md", "simulator.md", "judge.md"} <= pages


def repository_view(tmp_path: Path) -> Path:
    view = tmp_path / "repo"
    view.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", "site", "wandb", ".git"}:
            (view / entry.name).symlink_to(entry)
    return view


@pytest.mark.parametrize("where,body,timeout", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_docs_command_block_runs_as_written(where, body, timeout, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.update({"WANDB_MODE": "disabled", "MPLBACKEND": "Agg"})
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", body],
        cwd=repository_view(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{where}\n{body}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


# ── the times the pages state ────────────────────────────────────────────────────────────

#: Every time a page states for these commands is bench/cpu_times.py's record of it; the
#: longest names first (a rehearsal's command holds its question's).
TIMED = (
    ("make rehearsal KILL_AT=1", "kill-resume"),
    ("make agent-arm ENV=cooking ARM=zero REHEARSAL=1", "agent-zero"),
    ("make agent-arm ENV=cooking ARM=mask REHEARSAL=1", "agent-mask"),
    ("make agent-arm ENV=cooking ARM=turn REHEARSAL=1", "agent-turn"),
    ("make q3 REHEARSAL=1 FORCE=1", "q3"),
    ("make q2 REHEARSAL=1", "q2"),
    ("make q1 REHEARSAL=1", "q1"),
    ("make demo", "demo"),
    ("make test", "test"),
)
A_TIME = re.compile(r"\b\d+ min(?: \d+ s)?\b|\b\d+ s\b")
VAGUE = re.compile(
    r"about (?:a|an|one|\d+(?:\.\d+)?) (?:minutes?|min)\b|\bin (?:minutes|seconds)\b|"
    r"a second or two",
    re.I,
)


#: A time after ``install`` on these commands' line is their install's figure.
INSTALLS = {"test": "install", "demo": "demo-install"}


def time_claims(text: str) -> list[tuple[str, str, str]]:
    """(figure, time stated, line) for every time on a line whose nearest make command before
    it is a timed one; a time after ``install`` on ``make test``'s or ``make demo``'s line is
    its install's (``INSTALLS``)."""
    claims = []
    for line in text.splitlines():
        plain = line.replace("`", "")
        for match in A_TIME.finditer(plain):
            before = plain[: match.start()]
            found = [(before.rfind(cmd), name) for cmd, name in TIMED if cmd in before]
            if not found:
                continue
            at, name = max(found)
            if at != before.rfind("make "):  # another make command is nearer: not timed
                continue
            if name in INSTALLS and "install" in before[at:]:
                name = INSTALLS[name]
            claims.append((name, match.group(), line.strip()))
    return claims


def pages_with_times() -> dict[str, str]:
    makefile = (ROOT / "Makefile").read_text()
    helptext = makefile.split("\n\n", 1)[0]
    pages = {p.name: p.read_text() for p in PAGES}
    return {"README.md": (ROOT / "README.md").read_text(), "Makefile": helptext, **pages}


def test_every_time_the_pages_state_for_a_cpu_command_is_the_measured_one():
    record = json.loads((ROOT / "bench" / "cpu_times.json").read_text())
    wrong, vague, stated = [], [], set()
    for name, text in pages_with_times().items():
        for figure, time, line in time_claims(text):
            stated.add(figure)
            if figure not in record or record[figure]["display"] != time:
                wrong.append(f"{name}: {time} for {figure} ({line[:80]})")
        vague += [f"{name}: {m.group()}" for m in VAGUE.finditer(text)]
    assert wrong == [] and vague == []
    assert stated == set(record) == {"install", "test", "demo", "demo-install", "q1", "q2", "q3",
                                     "agent-zero", "agent-mask", "agent-turn", "kill-resume"}  # fmt: skip
    readme = {f for f, _, _ in time_claims((ROOT / "README.md").read_text())}
    # the newcomer's figures, on the front page: make demo's with its first install
    assert {"install", "test", "demo", "demo-install"} <= readme


def test_the_time_check_reads_a_claim_and_its_install():
    line = "make test   # the test suite: 6 min 40 s, after an install of 2 min 6 s"
    assert time_claims(line) == [("test", "6 min 40 s", line), ("install", "2 min 6 s", line)]
    demo = "make demo   # the four scenarios: 54 s, after an install of 1 min 2 s"
    assert [c[:2] for c in time_claims(demo)] == [("demo", "54 s"), ("demo-install", "1 min 2 s")]
    row = "| `make q3 REHEARSAL=1 FORCE=1` (41 s) | `make q1` in 3 s |"
    assert [c[:2] for c in time_claims(row)] == [("q3", "41 s")]  # bare make q1: not timed
    assert VAGUE.search("make demo takes about a minute")
