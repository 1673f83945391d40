"""Experiment entry points: the ``opl-rank`` CLI, configs and sweeps (compose library calls)."""
