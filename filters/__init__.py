"""Sample filters: targets of ``--rollout-sample-filter-path`` (Miles and slime).

``filters.mask_truncated_zero_reward``  the mask arm: every capped trajectory is masked.
``filters.mask_random_fraction``        a fraction ``RESCUE_MASK_RHO`` of them (default 0.5).

Both are ``fn(args, groups) -> None``, in place; see ``filters.mask``.
"""

from filters.mask import mask_decision, mask_random_fraction, mask_truncated_zero_reward

__all__ = ["mask_decision", "mask_random_fraction", "mask_truncated_zero_reward"]
