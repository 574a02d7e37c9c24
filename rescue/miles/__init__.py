"""Miles adapter: the hooks a Miles fully-async run switches on with flags.

- ``--custom-async-data-buffer-path rescue.miles.buffer.RescueDataBuffer``: Miles'
  buffer with the stale-group gate (settings ``RESCUE_ARM``, ``RESCUE_A``,
  ``RESCUE_SEED``) and the outcome census under ``rollout/census/*``.
- ``--rollout-function-path rescue.miles.pace.PaceRolloutFn`` (instead of
  ``--fully-async``): the pace arm, Miles' fully-async rollout waiting for stragglers
  (``RESCUE_ARM=pace``, setting ``RESCUE_PACE_WINDOW``).
- ``--custom-reward-post-process-path rescue.miles.reward.post_process_rewards``: group
  normalization over the chosen baseline population, then the ``1/a`` weights.
- ``--custom-rollout-log-function-path rescue.miles.log.log_rollout``: the sample-level
  census under ``rollout/census/samples/*``; Miles' own logging still runs.
- ``--loss-type custom_loss --custom-loss-function-path rescue.miles.loss.policy_loss``:
  Miles' policy loss on the per-token advantages of ``RESCUE_ESTIMATOR=turn``, recording the
  trained advantages' moments.
- ``--custom-megatron-before-train-step-hook-path rescue.miles.train_step.before_train_step``:
  the optimizer-step wrapper (``rescue.miles.step``), logging ``train/rescue/*``.
- ``--custom-pg-loss-reducer-function-path rescue.miles.drgrpo.pg_loss_reducer``: Dr. GRPO's
  constant divisor.

The hooks read Miles samples through the core's sample model (``rescue.samples``).
Importing this package needs no Miles; Miles is imported when a hook runs.
"""
