"""Rollouts: the states training starts from, how episodes are played on from them, advantages, and TRL's
``rollout_func`` for each mode."""
