"""Miles' target of ``--custom-reward-post-process-path rescue.miles.reward.post_process_rewards``.

The hook is the core's (``rescue.reward``, which slime's launcher names directly); this path
is the one Miles' launchers pass, and the one the runs they started recorded.
"""

from __future__ import annotations

from rescue.reward import post_process_rewards

__all__ = ["post_process_rewards"]
