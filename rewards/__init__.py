"""TRL reward functions, one per shaped reward component.

They land with the rollout issue: each reads the per-row fields that ``rollout_func`` returns.
"""
