"""One command per research question (``make q1``, ``make q2``, ``make q3``): the existing
commands as resumable stages in a run folder (``rescue.stages``), ``rescue status``."""
