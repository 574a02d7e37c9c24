"""SWE-smith rows → Miles prompt JSONL.

Specification
-------------
Input is the Hugging Face dataset ``SWE-bench/SWE-smith`` (or any dataset of the same
schema, by name) or a local ``.jsonl`` / ``.json`` / ``.parquet`` file of its rows. A row
needs ``instance_id``, ``repo``, ``image_name``, ``problem_statement``, ``FAIL_TO_PASS``
and ``PASS_TO_PASS`` (the test lists as lists of strings, or as JSON-encoded lists as in
SWE-bench); other fields (``patch``, ``created_at``, ``base_commit``) are ignored.

Every input row lands in exactly one place of the ``PrepareReport``:

- ``written``: one output line ``{"prompt": problem_statement, "metadata": {instance_id,
  repo, image, FAIL_TO_PASS, PASS_TO_PASS}}`` (the ``--input-key prompt --metadata-key
  metadata`` layout), in input order;
- ``empty_problem``: the problem statement is missing or blank (the agent would have no
  task);
- ``no_fail_to_pass``: no FAIL_TO_PASS test (nothing could tell a fix from no fix);
- ``not_in_subset``: a subset file was given and does not list the instance.

Beside the output, ``<output stem>.reference.jsonl`` holds ``{"instance_id", "patch"}`` for
every written task whose row has a non-empty ``patch`` (the bug; its reverse is the
reference solution ``rescue swe validate`` grades). The reference stays out of the prompt's
metadata, which travels with every sample to the agent function.

Subset ids that match no written task are reported (``missing_subset_ids``), not dropped
silently. A malformed row, a duplicate ``instance_id`` or a missing file is a
``ValueError`` naming the row and the field.

Image names: one image per repository at a commit, named
``<namespace>/swesmith.<arch>.<owner>_1776_<repo>.<commit8>`` (lower case). Older rows and
caches use the ``jyangballin/`` namespace for the same images, newer ones ``swebench/``;
both are rewritten to one namespace (default ``swebench``, which is what swesmith's
profiles build and pull). A ``docker.io/`` prefix is dropped; tags are kept; names
outside these namespaces are left as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.rows import read_rows

#: Default Hugging Face dataset (swesmith.constants.HF_DATASET).
HF_DATASET = "SWE-bench/SWE-smith"
#: Namespace swesmith's profiles use for task images (swesmith.constants.ORG_NAME_DH).
IMAGE_NAMESPACE = "swebench"
#: Namespaces known to hold the SWE-smith task images.
KNOWN_IMAGE_NAMESPACES = ("swebench", "jyangballin")
#: Fields a row must have.
REQUIRED_FIELDS = (
    "instance_id",
    "repo",
    "image_name",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
_DOCKER_HUB_PREFIXES = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")


@dataclass
class PrepareReport:
    """Where every input row went (see the module specification)."""

    source: str
    output: str
    rows: int = 0
    written: int = 0
    empty_problem: int = 0
    no_fail_to_pass: int = 0
    not_in_subset: int = 0
    images_renamed: int = 0
    references: int = 0
    subset_size: int | None = None
    missing_subset_ids: list[str] = field(default_factory=list)

    def render(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"{self.source}: {self.rows} rows -> {self.written} tasks written to {self.output}",
            f"  skipped: {self.empty_problem} empty problem statement, "
            f"{self.no_fail_to_pass} without FAIL_TO_PASS tests, "
            f"{self.not_in_subset} not in the subset",
            f"  image names rewritten: {self.images_renamed}",
            f"  reference solutions: {self.references} (for rescue swe validate)",
        ]
        if self.subset_size is not None:
            lines.append(
                f"  subset: {self.subset_size} ids, {len(self.missing_subset_ids)} not found"
            )
            lines += [f"    not found: {i}" for i in self.missing_subset_ids[:20]]
            if len(self.missing_subset_ids) > 20:
                lines.append(f"    ... and {len(self.missing_subset_ids) - 20} more")
        return "\n".join(lines)


def normalize_image(name: str, namespace: str = IMAGE_NAMESPACE) -> str:
    """The task image under ``namespace`` (default ``swebench``); see the module docstring.

    ``jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536`` →
    ``swebench/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536``.
    """
    image = name.strip()
    for prefix in _DOCKER_HUB_PREFIXES:
        if image.lower().startswith(prefix):
            image = image[len(prefix) :]
            break
    ns, sep, rest = image.partition("/")
    if sep and ns.lower() in KNOWN_IMAGE_NAMESPACES and rest.lower().startswith("swesmith."):
        return f"{namespace.rstrip('/')}/{rest.lower()}"
    return image


def reference_path(tasks_path: str | os.PathLike[str]) -> Path:
    """Where ``prepare`` keeps the references of a prompt file: ``x.jsonl`` → ``x.reference.jsonl``."""
    p = Path(tasks_path)
    return p.with_name(p.name.removesuffix(".jsonl") + ".reference.jsonl")


def read_subset(path: str | os.PathLike[str]) -> list[str]:
    """Instance ids listed in a subset file: one per line; blank lines and ``#`` comments skipped."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"subset file {str(p)!r} does not exist")
    ids = []
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.append(line)
    return ids


def _test_list(where: str, iid: str, row: Mapping[str, Any], key: str) -> list[str]:
    value = row[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InputError(
                f"{where} (instance_id={iid}): field {key!r} is a string but not a JSON list"
            ) from None
    if value is None:
        value = []
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise InputError(
            f"{where} (instance_id={iid}): field {key!r} must be a list of test ids (strings), "
            f"got {type(value).__name__}"
        )
    return list(value)


def _nonempty_str(where: str, row: Mapping[str, Any], key: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        iid = row.get("instance_id")
        who = f" (instance_id={iid})" if key != "instance_id" else ""
        raise InputError(f"{where}{who}: field {key!r} must be a non-empty string, got {value!r}")
    return value.strip()


def task_from_row(
    where: str, row: Any, *, image_namespace: str = IMAGE_NAMESPACE
) -> dict[str, Any] | None:
    """The prompt line for one row, or ``None`` when its problem statement is empty.

    Raises ``ValueError`` naming ``where`` and the field when the row is malformed.
    """
    if not isinstance(row, Mapping):
        raise InputError(f"{where}: expected an object (a dataset row), got {type(row).__name__}")
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        raise InputError(
            f"{where} (instance_id={row.get('instance_id')}): missing field {missing[0]!r}; "
            f"SWE-smith rows need {', '.join(REQUIRED_FIELDS)}"
        )
    iid = _nonempty_str(where, row, "instance_id")
    repo = _nonempty_str(where, row, "repo")
    image = _nonempty_str(where, row, "image_name")
    f2p = _test_list(where, iid, row, "FAIL_TO_PASS")
    p2p = _test_list(where, iid, row, "PASS_TO_PASS")
    problem = row["problem_statement"]
    if problem is not None and not isinstance(problem, str):
        raise InputError(
            f"{where} (instance_id={iid}): field 'problem_statement' must be a string, "
            f"got {type(problem).__name__}"
        )
    if problem is None or not problem.strip():
        return None
    return {
        "prompt": problem,
        "metadata": {
            "instance_id": iid,
            "repo": repo,
            "image": normalize_image(image, image_namespace),
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
        },
    }


def prepare(
    source: str,
    output: str | os.PathLike[str],
    *,
    split: str = "train",
    subset: str | os.PathLike[str] | Sequence[str] | None = None,
    image_namespace: str = IMAGE_NAMESPACE,
    rows: Iterable[tuple[str, Any]] | None = None,
) -> PrepareReport:
    """Write the prompt JSONL for ``source`` to ``output``; returns where each row went.

    ``split``: dataset split (default ``train``). ``subset``: a subset file (as written by
    the pilot) or a list of instance ids; default ``None`` keeps every task.
    ``image_namespace``: namespace image names are rewritten to (default ``swebench``).
    ``rows``: already-read ``(where, row)`` pairs, instead of reading ``source``.
    The output is written to a temporary file and renamed, so it is never half written.
    """
    subset_ids: list[str] | None = None
    if subset is not None:
        subset_ids = read_subset(subset) if isinstance(subset, (str, os.PathLike)) else list(subset)
    wanted = set(subset_ids) if subset_ids is not None else None
    out = Path(output)
    report = PrepareReport(source=str(source), output=str(out))
    report.subset_size = None if subset_ids is None else len(set(subset_ids))
    seen: dict[str, str] = {}
    written_ids: set[str] = set()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    refs = reference_path(out)
    refs_tmp = refs.with_name(refs.name + ".tmp")
    try:
        with tmp.open("w") as f, refs_tmp.open("w") as r:
            for where, row in rows if rows is not None else read_rows(source, split=split):
                report.rows += 1
                task = task_from_row(where, row, image_namespace=image_namespace)
                if task is None:
                    report.empty_problem += 1
                    continue
                meta = task["metadata"]
                iid = meta["instance_id"]
                if iid in seen:
                    raise InputError(
                        f"{where}: duplicate instance_id {iid!r} (first at {seen[iid]})"
                    )
                seen[iid] = where
                if not meta["FAIL_TO_PASS"]:
                    report.no_fail_to_pass += 1
                    continue
                if wanted is not None and iid not in wanted:
                    report.not_in_subset += 1
                    continue
                if meta["image"] != str(row["image_name"]).strip():
                    report.images_renamed += 1
                f.write(json.dumps(task) + "\n")
                written_ids.add(iid)
                report.written += 1
                patch = row.get("patch")
                if isinstance(patch, str) and patch.strip():
                    r.write(json.dumps({"instance_id": iid, "patch": patch}) + "\n")
                    report.references += 1
        tmp.replace(out)
        refs_tmp.replace(refs)
    finally:
        tmp.unlink(missing_ok=True)
        refs_tmp.unlink(missing_ok=True)
    if subset_ids is not None:
        report.missing_subset_ids = sorted(set(subset_ids) - written_ids)
    return report
