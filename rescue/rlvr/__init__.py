"""Single-turn RLVR with a length cap: the data, the cap calibration and the sweep's watcher.

``rescue.rlvr.data`` (GSM8K / MATH rows to Miles prompt JSONL), ``rescue.rlvr.calibrate``
(the smallest cap whose truncation rate at initialization lies in the window) and
``rescue.rlvr.sweep`` (progress and failures of a sweep's Ray jobs). The arms themselves are
flags of the launchers (``launch/rlvr.sh``); importing this package needs no framework.
"""
