"""Experiments: experiment files, the runner, run folders and their resume rule, progress, the per-network probe, the report."""
