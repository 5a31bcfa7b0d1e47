"""Sweeps: a grid of presets x token budgets run through Hydra multirun, and `collect` into one table."""
