"""slime adapter: a fully-async ``--rollout-function-path`` with the stale-group gate.

slime's fully-async path has no buffer hook, no staleness limit and calls neither the
sample filter nor any census. ``rescue.slime.rollout.generate_rollout`` reuses slime's
``AsyncRolloutWorker`` and adds them. The reward hook
``rescue.miles.reward.post_process_rewards`` works for slime unchanged (same signature);
``rescue.slime.advantages.turn_advantages`` (``--custom-advantage-function-path``) trains
its per-token advantages under ``RESCUE_ESTIMATOR=turn``.

slime is imported only when the rollout function runs.
"""
