"""Plackett-Luce mathematics: sampling, prefix and placement probabilities, exact position
marginals, many-prefix sampling, and the PL policy-gradient estimators.

The bottom layer: pure JAX functions on arrays. It imports nothing from the rest of
``opl_rank`` except [`opl_rank.tuning`][opl_rank.tuning] (tests/test_layout.py checks).
"""

from opl_rank.pl import gradients, marginals, plackett_luce, prefix_sampling

__all__ = ["gradients", "marginals", "plackett_luce", "prefix_sampling"]
