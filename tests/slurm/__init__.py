"""Helpers for tests against a real local Slurm (cluster.py, conftest_slurm.py)."""
