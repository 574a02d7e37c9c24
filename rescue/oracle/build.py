"""``rescue oracle build``: each arm's replay input from a never-drop run's dumps.

Specification
-------------
Input: debug rollout dumps (``--save-debug-rollout-data``) of a run whose groups went
through rescue's gate with ``--max-weight-staleness K`` and every group kept (``RESCUE_ARM=
never-drop`` through rescue's buffer: the launchers' ``ARM=never-drop`` with ``DUMP_STEPS``).
Every sample then carries ``rescue_staleness``, ``rescue_would_drop`` and ``rescue_coin``
(``rescue.samples``). A sample without them, a group whose samples disagree, or a sample
with a loss weight other than 1 (the run was not never-drop) is an error naming the file
and the sample; so is a sample without ``group_index``.

Per dumped step (one file, its ``rollout_id``) and per arm, in this order:

``all``             every group (the oracle: never-drop's batch);
``drop``            the stale groups excluded (``Gate(drop)``);
``stale``           only the groups ``drop`` excludes (their own gradient);
``protect-a<A>``    ``Gate(protect, a=A)`` on the recorded coin: a stale group is kept with
                    loss weight ``1/A`` (``metadata["rescue_weight"]``, which rescue's reward
                    hook multiplies into the advantage) when its coin is below ``A``,
                    excluded otherwise.

Each decision is ``rescue.gate.Gate.decide_drawn`` on the recorded flag and coin, the rule
the buffer applies. An excluded group stays in the batch with ``remove_sample`` set on every
sample (Miles zeroes its loss masks), so every arm has the same rollouts, the same groups'
baselines and the same loss denominators (Miles' ``num_rollouts`` counts masked rollouts):
``g_all − g_drop = g_stale`` exactly. Miles' drop arm instead refills its batch with fresh
groups; ``compare`` reports the norm ratio rescaled by ``rollouts / trained_rollouts`` for
that reading. A ``remove_sample`` already in the dump (a budget mask filter) is kept in
every arm. The replay inputs are written as Miles writes dumps (``{"rollout_id",
"metadata", "samples": [Sample.to_dict()]}``) under ``rollout_data/{rollout_id}.pt`` with
consecutive replay ids, and the manifest ``oracle.json`` lists them
(``rescue.oracle.manifest``). The folder is written beside the old one and swapped in when
every dump is read (``rescue.output``): a failed build leaves an earlier oracle folder as it
was; a finished one replaces what the oracle's steps had written there (``OWNED``).
"""

from __future__ import annotations

import glob
import os
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rescue.errors import InputError
from rescue.gate import Arm, Gate
from rescue.oracle.manifest import GRADIENTS, MANIFEST, ROLLOUT_DATA, STATS, Entry, Manifest
from rescue.output import check_out, staged
from rescue.samples import COIN_KEY, WEIGHT_KEY, WOULD_DROP_KEY, rollout_key

#: What the oracle's steps write in its folder (build, the replay's gradients or streamed
#: statistics, compare): replaced by a new build, which they derive from; the rest stays.
OWNED = (MANIFEST, ROLLOUT_DATA, GRADIENTS, STATS, "compare.json", "compare.md")

#: The arms ``build`` writes by default, in replay order (``all`` must come first).
DEFAULT_ARMS = ("all", "drop", "stale", "protect")
#: The protect arm's keep probability when none is given.
DEFAULT_A = (0.5,)
#: How to record dumps the oracle can read.
RECORDING = (
    "record with rescue's buffer, RESCUE_ARM=never-drop and --max-weight-staleness K "
    "(launchers: ARM=never-drop STALENESS=K DUMP_STEPS=N)"
)


def arm_names(arms: Sequence[str], a_values: Sequence[float]) -> list[str]:
    """The replay arms in order: ``protect`` expands to ``protect-a<A>`` per ``A``."""
    out: list[str] = []
    for arm in arms:
        if arm == "protect":
            for a in a_values:
                Gate(arm="protect", a=a)  # validates A: 0 < A <= 1
                out.append(f"protect-a{a:g}")
        elif arm in ("all", "drop", "stale"):
            out.append(arm)
        else:
            raise InputError(f"--arms: {arm!r} is not an arm; allowed: all, drop, stale, protect")
    if not out or out[0] != "all":
        raise InputError("--arms must start with all (the oracle every arm is compared with)")
    if len(set(out)) != len(out):
        raise InputError(f"--arms names an arm twice: {', '.join(out)}")
    return out


def keeps(arm: str, would_drop: bool, u: float) -> tuple[bool, float]:
    """Whether ``arm`` trains a group, and its loss weight, from the recorded flag and coin."""
    if arm == "stale":
        return not Gate(arm=Arm.DROP).decide_drawn(would_drop, u).keep, 1.0
    if arm.startswith("protect-a"):
        gate = Gate(arm=Arm.PROTECT, a=float(arm[len("protect-a") :]))
    else:
        gate = Gate(arm=Arm.NEVER_DROP if arm == "all" else Arm.DROP)
    decision = gate.decide_drawn(would_drop, u)
    return decision.keep, decision.weight if decision.protected else 1.0


def dump_files(paths: Sequence[str]) -> list[str]:
    """Dump files from directories (their ``*.pt``, else ``rollout_data/*.pt``), files or globs."""
    from rescue.replay.dumps import _natural, expand_paths

    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, "*.pt")), key=_natural)
            if not found:
                found = sorted(glob.glob(os.path.join(path, ROLLOUT_DATA, "*.pt")), key=_natural)
            if not found:
                raise InputError(f"{path}: no dump files (*.pt, or rollout_data/*.pt)")
            out.extend(found)
        else:
            out.extend(expand_paths([path]))
    return out


def _tags(samples: Sequence[Mapping[str, Any]], source: str) -> dict[Any, tuple[bool, float]]:
    """Each group's recorded (would_drop, coin), checked on every sample."""
    tags: dict[Any, tuple[bool, float]] = {}
    for pos, s in enumerate(samples):
        where = f"{source}: samples[{pos}] (index={s.get('index')})"
        g = s.get("group_index")
        if g is None:
            raise InputError(f"{where} has no group_index; the oracle selects whole groups")
        md = s.get("metadata") or {}
        if WOULD_DROP_KEY not in md or COIN_KEY not in md:
            raise InputError(
                f"{where} has no metadata {WOULD_DROP_KEY!r} / {COIN_KEY!r}: not recorded by "
                f"rescue's gate; {RECORDING}"
            )
        weight = float(md.get(WEIGHT_KEY, 1.0))
        if weight != 1.0:
            raise InputError(
                f"{where} has {WEIGHT_KEY}={weight:g}: a protect run's dump lacks the groups it "
                f"dropped; {RECORDING}"
            )
        tag = (bool(md[WOULD_DROP_KEY]), float(md[COIN_KEY]))
        if not 0.0 <= tag[1] < 1.0:  # NaN fails the comparison too
            raise InputError(f"{where}: {COIN_KEY}={md[COIN_KEY]!r}; allowed: a number in [0, 1)")
        if tags.setdefault(g, tag) != tag:
            raise InputError(
                f"{where}: group {g!r} has samples with different {WOULD_DROP_KEY} / {COIN_KEY} "
                f"({tags[g]} and {tag}); the gate tags whole groups"
            )
    return tags


def select(
    samples: Sequence[Mapping[str, Any]], tags: Mapping[Any, tuple[bool, float]], arm: str
) -> tuple[list[dict], dict[str, int]]:
    """The arm's copy of a step's samples, and its counts."""
    out, rollouts, trained_rollouts, trained_groups = [], set(), set(), set()
    for pos, s in enumerate(samples):
        g = s["group_index"]
        keep, weight = keeps(arm, *tags[g])
        copy = dict(s)
        metadata = dict(s.get("metadata") or {})
        metadata.pop(WEIGHT_KEY, None)
        if keep and weight != 1.0:
            metadata[WEIGHT_KEY] = weight
        copy["metadata"] = metadata
        if not keep:
            copy["remove_sample"] = True
        key = rollout_key(s)
        rollout = (g, ("row", pos) if key is None else key)
        rollouts.add(rollout)
        if not copy.get("remove_sample", False):
            trained_rollouts.add(rollout)
            trained_groups.add(g)
        out.append(copy)
    counts = {
        "rollouts": len(rollouts),
        "groups": len(tags),
        "stale_groups": sum(1 for would_drop, _ in tags.values() if would_drop),
        "trained_groups": len(trained_groups),
        "trained_rollouts": len(trained_rollouts),
    }
    return out, counts


def build(
    paths: Sequence[str],
    out_dir: str,
    *,
    arms: Sequence[str] = DEFAULT_ARMS,
    a_values: Sequence[float] = DEFAULT_A,
    unsafe_load: bool = False,
    force: bool = False,
    progress: bool = True,
) -> Manifest:
    """Write every arm's replay input of every dumped step, and the manifest (module docstring).

    Defaults: arms all, drop, stale, protect; ``a = 0.5``; the restricted unpickler; an
    existing ``oracle.json`` in ``out_dir`` is refused unless ``force``; a progress bar.
    """
    import torch

    from rescue.progress import progress_bar
    from rescue.replay.dumps import read_payload

    names = arm_names(arms, a_values)
    files = dump_files(paths)
    if os.path.exists(os.path.join(out_dir, MANIFEST)) and not force:
        raise InputError(f"{out_dir} already holds {MANIFEST}; pass --force to rebuild it")
    check_out(Path(out_dir))
    manifest = Manifest(arms=names)
    with staged(out_dir, owned=lambda entry: entry.name in OWNED) as stage:
        os.makedirs(stage.path / ROLLOUT_DATA)
        with progress_bar(
            len(files), unit="dumps", desc="oracle", enabled=progress and len(files) > 1
        ) as bar:
            steps: dict[int, str] = {}
            for ordinal, path in enumerate(files):
                payload = read_payload(path, unsafe_load=unsafe_load)
                if not isinstance(payload, Mapping) or not isinstance(payload.get("samples"), list):
                    raise InputError(f"{path}: not a debug rollout dump (no 'samples' list)")
                rid = payload.get("rollout_id")
                step = int(rid) if isinstance(rid, int) else ordinal
                if step in steps:
                    raise InputError(f"{path} and {steps[step]} are both step {step}")
                steps[step] = path
                samples = payload["samples"]
                tags = _tags(samples, path)
                for arm in names:
                    selected, counts = select(samples, tags, arm)
                    entry = Entry(
                        rollout_id=len(manifest.entries), step=step, arm=arm, source=path, **counts
                    )
                    data = {
                        "rollout_id": entry.rollout_id,
                        "metadata": payload.get("metadata") or {},
                        "samples": selected,
                    }
                    try:
                        torch.save(data, stage.path / ROLLOUT_DATA / f"{entry.rollout_id}.pt")
                    except pickle.PicklingError as e:
                        raise InputError(
                            f"{path}: its samples hold framework objects read as inert stand-ins "
                            f"({e}); to copy them, load the dumps as themselves: --unsafe-load with "
                            "Miles on PYTHONPATH, for dumps you trust"
                        ) from None
                    manifest.entries.append(entry)
                bar.update(1)
        manifest.write(str(stage.path))
    return manifest
