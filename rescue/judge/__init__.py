"""The judge of the pre-registered predictions P1-P7 (``rescue report``).

Every prediction lives once, in ``predictions`` (P1, P2 and the offline half of P7 read
``rescue replay`` reports through ``offline``): its quantity (``quantities``), the arms
it compares, its rule in this project's words, a window fixed in code (``windows``), its
equivalence margin, the cohorts it applies to, the checks it makes (``rules``), and a
verdict in ``as predicted`` / ``opposite`` / ``no difference`` / ``inconclusive`` / ``not
judgeable`` computed from per-seed values (``stats``: paired by seed, t intervals on
n − 1 dof). The deciding checks of one report are one family under Holm's step-down
(``family``). The same judge writes the simulator's summary (``make demo``) and the
report on real runs (``inputs`` reads the simulator's census JSONL, wandb offline runs
and CSV/JSON exports; ``runs`` groups them into cohorts).

numpy at import; scipy.stats (a core dependency) inside the functions that need a
distribution; matplotlib (the ``sim`` extra) only for ``plots``.
"""

from rescue.judge.evaluation import Prediction, Result, evaluate
from rescue.judge.predictions import PREDICTIONS
from rescue.judge.report import Judgement, judge, markdown
from rescue.judge.runs import Condition, Run
from rescue.judge.stats import LEVEL, MIN_SEEDS, VERDICTS

__all__ = [
    "LEVEL",
    "MIN_SEEDS",
    "PREDICTIONS",
    "VERDICTS",
    "Condition",
    "Judgement",
    "Prediction",
    "Result",
    "Run",
    "evaluate",
    "judge",
    "markdown",
]
