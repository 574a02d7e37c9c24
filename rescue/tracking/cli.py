"""The census in wandb: a saved workspace, and its picture from offline runs.

``rescue wandb workspace ENTITY/PROJECT [--group REGEX] [--dry-run]`` saves the workspace
of ``rescue.tracking.workspace`` (sections by question, runs grouped by wandb group) to the
project and prints its URL; ``--dry-run`` prints its sections and panels and saves
nothing (no wandb-workspaces, credentials or network needed). ``rescue wandb preview RUNS...
--out FILE.png`` draws the same panels from offline runs (``offline-run-*`` folders, or a
folder holding them, e.g. a ``rescue sim`` output's ``wandb/``). Examples::

    rescue wandb workspace my-lab/rescue-swe --dry-run
    rescue wandb workspace my-lab/rescue-swe --group 'swe-(drop|protect)-.*'
    rescue wandb preview runs/sim/fast-thorough/wandb --out workspace.png
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rescue.errors import InputError

DEFAULT_PREVIEW = "runs/workspace.png"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    w = sub.add_parser("workspace", help="save the census' workspace to a wandb project")
    w.add_argument("project", metavar="ENTITY/PROJECT", help="the wandb project")
    w.add_argument(
        "--group",
        default=None,
        metavar="REGEX",
        help="show only the runs whose wandb group matches this regular expression "
        "(default: every run of the project)",
    )
    w.add_argument(
        "--dry-run",
        action="store_true",
        help="print the workspace's sections and panels; save nothing (default: save it)",
    )
    p = sub.add_parser("preview", help="draw the workspace's panels from offline runs (PNG)")
    p.add_argument(
        "runs", nargs="+", metavar="RUNS", help="offline-run-* folders or folders above them"
    )
    p.add_argument("--out", default=DEFAULT_PREVIEW, help="the PNG to write (default: %(default)s)")
    p.add_argument("--title", default="", help="a title over the picture (default: none)")


def main(args: argparse.Namespace) -> int:
    if args.action == "workspace":
        return _workspace(args)
    return _preview(args)


def _workspace(args: argparse.Namespace) -> int:
    from rescue.tracking.workspace import build, describe, group_filter

    entity, project = _project(args.project)
    group = group_filter(args.group)
    if args.dry_run:
        print(describe(entity, project, group))
        return 0
    from rescue.tracking.online import explain

    workspace = build(entity, project, group)
    try:
        workspace.save()
        url = workspace.url
    except Exception as e:
        raise InputError(f"wandb:{entity}/{project}: {explain(e, entity, project)}") from None
    print(f"workspace saved: {url}")
    return 0


def _project(text: str) -> tuple[str, str]:
    from rescue.tracking.online import PREFIX, parse_project

    parsed = parse_project(PREFIX + text.removeprefix(PREFIX))
    if parsed.group is not None:
        raise InputError(f"ENTITY/PROJECT {text!r}; allowed: ENTITY/PROJECT (a group: --group)")
    return parsed.entity, parsed.project


def _preview(args: argparse.Namespace) -> int:
    from rescue.tracking.history import read_offline, run_id_of

    out = Path(args.out)
    if out.suffix.lower() != ".png" or out.is_dir():
        raise InputError(f"--out {args.out!r}; allowed: a .png file (replaced when drawn)")
    folders: dict[tuple[Path, str], list[Path]] = {}
    for raw in args.runs:
        root = Path(raw)
        if not root.exists():
            raise InputError(f"RUNS: {raw!r} does not exist")
        found = [root] if list(root.glob("run-*.wandb")) else sorted(root.rglob("offline-run-*"))
        found = [d for d in found if d.is_dir() and not d.is_symlink()]
        if not found:
            raise InputError(f"RUNS: no offline-run-* folder under {raw!r}")
        for d in found:
            folders.setdefault((d.parent, run_id_of(d)), []).append(d)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        logs = list(pool.map(read_offline, [sorted(v) for v in folders.values()]))
    from rescue.tracking.preview import draw

    tmp = out.with_name(f".{out.name}.tmp.png")
    draw(logs, tmp, title=args.title)
    tmp.replace(out)
    print(f"preview of {len(logs)} runs: {out}")
    return 0
