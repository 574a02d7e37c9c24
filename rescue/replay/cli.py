"""Offline replay of debug rollout dumps: the outcome census, the arms' advantages, their gradients.

``rescue replay census DUMPS...``       outcome census per step and in total, and the regime
                                          (budget failures vs infrastructure no-results);
``rescue replay advantages DUMPS...``   per-token advantages under arms (a)-(e) with frozen
                                          statistics, their variance and the P7 verdict;
``rescue replay gradients DUMPS... --model M``
                                          the two-outcome identity check, then each arm's
                                          full-batch policy gradient compared with (a);
                                          with ``--trained DIR``, each dump's gradient as
                                          the trainer trains it, written for
                                          ``rescue oracle compare``.

DUMPS are files written by Miles or slime ``--save-debug-rollout-data`` (paths or globs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from rescue import flags


def number_list(text: str, kind: type = float) -> tuple:
    """``"0.5,0.25"`` -> ``(0.5, 0.25)`` (``kind`` float or int), for argparse ``type=``."""
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise argparse.ArgumentTypeError(
            f"{text!r}: allowed a comma-separated list of {what}"
        ) from None


def _floats(text: str) -> tuple[float, ...]:
    values = number_list(text)
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r}: allowed one or more comma-separated fractions in [0, 1]"
        )
    return values


def _ints(text: str) -> tuple[int, ...]:
    values = number_list(text, int)
    if not values or values[0] < 1 or any(b <= a for a, b in itertools.pairwise(values)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: allowed increasing comma-separated integers >= 1 (e.g. 1,2,4,8)"
        )
    return values


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dumps", nargs="+", metavar="DUMP", help="dump files or globs (one file per step)"
    )
    p.add_argument(
        "--reward-key",
        default=None,
        help="key of a dict reward, as Miles' --reward-key (default: scalar rewards)",
    )
    p.add_argument(
        "--unsafe-load",
        action="store_true",
        help="torch.load(weights_only=False): runs code from the file; only for dumps you trust (default off)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (default: text)")


def _arm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rho",
        type=_floats,
        default=(0.3, 0.6, 1.0),
        help="fractions of capped rollouts masked by the (d) arms (default 0.3,0.6,1.0)",
    )
    p.add_argument(
        "--seed",
        type=flags.NON_NEGATIVE,
        default=0,
        help="seed of the (d) arms' mask coin, as RESCUE_SEED (default 0)",
    )
    p.add_argument(
        "--kappa",
        type=flags.number(0),
        default=2.0,
        help="shrinkage of the turn-reached baseline, arm (e) (default 2.0)",
    )
    p.add_argument(
        "--no-std-normalize",
        dest="std_normalize",
        action="store_false",
        help="do not divide by the group std (Dr. GRPO); default: divide by the frozen group std (GRPO)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="replay_command", metavar="{census,advantages,gradients}", required=True
    )
    p = sub.add_parser("census", help="outcome census per step and in total")
    _common(p)
    p = sub.add_parser(
        "advantages", help="arms (a)-(e): per-token advantage variance and the P7 verdict"
    )
    _common(p)
    _arm_options(p)
    p = sub.add_parser("gradients", help="the arms' policy gradients at fixed parameters")
    _common(p)
    _arm_options(p)
    p.add_argument(
        "--model",
        required=True,
        help="local model dir, config JSON, or tiny-gpt2 / tiny-llama (random init)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64"),
        help="parameter dtype (default float32)",
    )
    p.add_argument(
        "--model-seed",
        type=flags.NON_NEGATIVE,
        default=0,
        help="seed of a randomly initialized model (default 0)",
    )
    p.add_argument(
        "--reduction",
        default="sum",
        choices=("sum", "sample-mean"),
        help="per-rollout loss: sum over tokens (the score function) or mean over its loss tokens, as Miles (default sum)",
    )
    p.add_argument(
        "--turn-edges",
        type=_ints,
        default=(1, 2, 4, 8, 16, 32),
        help="turn buckets' lower edges (default 1,2,4,8,16,32)",
    )
    p.add_argument(
        "--check-only",
        action="store_true",
        help="run the two-outcome identity check and stop (default off)",
    )
    p.add_argument(
        "--trained",
        metavar="DIR",
        default=None,
        help="instead of the arms' report, write each dump's gradient as the trainer trains "
        "it (its masks and loss weights, rescue.replay.trained) to DIR/<rollout_id>/model.pt, "
        "e.g. DIR = an oracle directory's gradients/; an earlier run's step folders there are "
        "replaced when every gradient is written, left as they were when it fails (default: off)",
    )


def _print(report: Any, text: str, as_json: bool) -> None:
    print(json.dumps(report, indent=2, default=str) if as_json else text)


def check_device(name: str) -> None:
    """``--device``: a device torch knows and this machine has (before any dump is read)."""
    import torch

    from rescue.errors import InputError

    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(
            f"--device {name!r}: not a torch device; allowed e.g. cpu, cuda, cuda:1"
        ) from None
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    if device.type != "cpu" and (available is None or not available()):
        raise InputError(
            f"--device {name!r}: no {device.type} device on this machine; allowed: cpu"
        )


def main(args: argparse.Namespace) -> int:
    from rescue.replay.dumps import load_dumps

    if args.replay_command == "gradients":
        check_device(args.device)

    dumps = load_dumps(
        args.dumps,
        reward_key=args.reward_key,
        need_tokens=args.replay_command == "gradients",
        unsafe_load=args.unsafe_load,
    )
    if args.replay_command == "census":
        from rescue.replay.census import census_report, format_report

        report = census_report(dumps)
        _print(report, format_report(report), args.json)
        return 0
    if args.replay_command == "advantages":
        from rescue.replay.arms import advantages_report, format_advantages

        report = advantages_report(
            dumps, rhos=args.rho, seed=args.seed, kappa=args.kappa, std_normalize=args.std_normalize
        )
        _print(report, format_advantages(report), args.json)
        return 0

    from rescue.replay.gradients import arm_gradients, format_gradients
    from rescue.replay.model import build_model

    vocab = 1 + max((max(s["tokens"], default=0) for d in dumps for s in d.samples), default=0)
    model = build_model(
        args.model,
        vocab_size=int(vocab),
        seed=args.model_seed,
        dtype=args.dtype,
        device=args.device,
    )
    if args.trained is not None:
        import torch

        from rescue.output import staged
        from rescue.replay.trained import trained_gradient

        out = Path(args.trained)
        with staged(out, owned=lambda entry: entry.name.isdigit()) as stage:
            lines = []
            for d in dumps:
                grads = trained_gradient(
                    d,
                    model,
                    std_normalize=args.std_normalize,
                    reduction=args.reduction,
                    device=args.device,
                )
                target = stage.path / str(d.step)
                target.mkdir(exist_ok=True)
                torch.save({k: v.cpu() for k, v in grads.items()}, target / "model.pt")
                norm = float(sum(float(v.double().pow(2).sum()) for v in grads.values())) ** 0.5
                lines.append(
                    f"{d.path}: rollout {d.step}, gradient norm {norm:.6e} -> "
                    f"{out / str(d.step) / 'model.pt'}"
                )
        print("\n".join(lines))
        return 0
    if args.check_only:
        from rescue.replay.arms import build_batch
        from rescue.replay.gradients import two_outcome_check
        from rescue.replay.model import Scorer

        batch = build_batch([t for d in dumps for t in d.trajectories])
        report = two_outcome_check(
            Scorer(model, args.device),
            batch,
            dumps,
            std_normalize=args.std_normalize,
            reduction=args.reduction,
        )
        _print(report, f"two-outcome check passed: {report}", args.json)
        return 0
    report = arm_gradients(
        dumps,
        model,
        device=args.device,
        rhos=args.rho,
        seed=args.seed,
        kappa=args.kappa,
        std_normalize=args.std_normalize,
        reduction=args.reduction,
        turn_edges=args.turn_edges,
    )
    _print(report, format_gradients(report), args.json)
    sys.stdout.flush()
    return 0
