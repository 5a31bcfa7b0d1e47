"""Scaling: the resource planner (params, FLOPs, per-GPU memory, time to budget) and scaling-law fits and plots."""
