"""The names the buffer and the pace rollout share, below both: no import circle between them.

Specification
-------------
- ``BUFFER_PATH`` and ``PACE_ROLLOUT_FUNCTION`` are the dotted paths Miles is given
  (``--custom-async-data-buffer-path``, ``--rollout-function-path``); each names the class
  Miles loads (``tests/test_miles_targets.py`` checks that they resolve to those classes).
- ``QUEUE_SIZE_KEY`` is Miles' key of its buffer's queue length, which both stores report.

``rescue.miles.buffer`` builds the pace queue of ``rescue.miles.pace``; ``rescue.miles.pace``
checks a run names the buffer. Both read these names from here, so neither imports the
other to learn a name.
"""

from __future__ import annotations

#: The data buffer of every arm (``--custom-async-data-buffer-path``).
BUFFER_PATH = "rescue.miles.buffer.RescueDataBuffer"
#: The rollout function the ``pace`` arm needs (it waits for stragglers; the buffer cannot).
PACE_ROLLOUT_FUNCTION = "rescue.miles.pace.PaceRolloutFn"
#: Key of Miles' queue length in its buffer metrics.
QUEUE_SIZE_KEY = "rollout/fully_async/queue_size"
