"""The gradient oracle: every arm's full-batch gradient on one cohort at one checkpoint.

A never-drop run records on each sample its group's staleness, whether the drop arm would
drop it and the protect coin (``rescue.gating.gate_group``), so one debug dump holds the
cohort and every arm's selection of it. ``build`` writes, per dumped step, one replay input
per arm; Miles replays them at a fixed checkpoint (``--load-debug-rollout-data``,
``--debug-disable-optimizer``) while ``rescue.miles.oracle`` captures each reduced gradient
(or its inner products with the earlier arms of the step), or ``rescue replay gradients
--trained`` computes them with a Hugging Face model; ``compare`` reports the cosines and
norm ratios. Nothing here imports a framework.
"""
