"""Sample filters: targets of ``--rollout-sample-filter-path`` (Miles and slime).

``filters.mask_truncated_zero_reward``  the mask arm: every capped trajectory is masked.
``filters.mask_random_fraction``        a fraction ``RESCUE_MASK_RHO`` of them (default 0.5).

Both are ``fn(args, groups) -> None``, in place; see ``filters.mask``. Which trajectory is
masked is decided by ``rescue.mask.mask_decision``, the rule the simulator and replay use.
"""

from filters.mask import mask_random_fraction, mask_truncated_zero_reward

__all__ = ["mask_random_fraction", "mask_truncated_zero_reward"]
