"""slime adapter: a fully-async ``--rollout-function-path`` with the stale-group gate.

slime's fully-async path has no buffer hook, no staleness limit and calls neither the
sample filter nor any census. ``rescue.slime.rollout.generate_rollout`` reuses slime's
``AsyncRolloutWorker`` (``rescue.slime.worker``: what it requeues and loses is reported)
and adds them (``rescue.slime.drain``; the pace arm's schedule in ``rescue.slime.pace``;
checks at start in ``rescue.slime.checks``; the engines' version in
``rescue.slime.versions``). ``rescue.slime.generate.generate``
(``--custom-generate-function-path``) records which tokens each model call produced, so
a reply slime aborts at a weight update and resumes is one turn and counts for staleness
only where it produced trained tokens. The reward hook
``rescue.reward.post_process_rewards`` (the core's, which Miles runs too) works for slime
unchanged (same signature);
``rescue.slime.advantages.turn_advantages`` (``--custom-advantage-function-path``) trains
its per-token advantages under ``RESCUE_ESTIMATOR=turn``.

slime is imported only when the rollout function runs.
"""
