"""CallableLogging: a user's logging policy that leaves fewer than L finite logits in a row
would log impossible rankings (excluded items in the remaining slots, prefix propensities
claiming probability 1); it is an error naming the function and the first bad row."""

import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import make_key
from simulators import SyntheticRankingEnv
from simulators.logging_policies import CallableLogging, as_logging_policy

D, L = 5, 3


def only_two_items_in_row_3(context, item_features):
    logits = np.zeros((context.shape[0], D), np.float32)
    logits[3:, 2:] = -np.inf  # rows 3.. keep items 0 and 1 only
    return logits


def test_fewer_than_l_finite_logits_names_the_function_and_row():
    policy = CallableLogging(only_two_items_in_row_3, D, ranking_length=L)
    with pytest.raises(
        ValueError, match=r"'only_two_items_in_row_3' returned fewer than L=3 finite logits.*row 3 has 2"
    ):
        policy(jnp.zeros((6, 2)), None)
    assert policy(jnp.zeros((3, 2)), None).shape == (3, D)  # rows 0..2 are fine
    wrapped = as_logging_policy(only_two_items_in_row_3, D, ranking_length=L)
    with pytest.raises(ValueError, match="row 3"):
        wrapped(jnp.zeros((6, 2)), None)
    # L = 2 is possible with two candidates
    assert CallableLogging(only_two_items_in_row_3, D, ranking_length=2)(jnp.zeros((6, 2)), None).shape == (6, D)
    with pytest.raises(ValueError, match="ranking_length"):
        CallableLogging(only_two_items_in_row_3, D, ranking_length=D + 1)


def test_simulator_refuses_to_log_impossible_rankings():
    policy = CallableLogging(only_two_items_in_row_3, D, ranking_length=L)
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L, logging_policy=policy)
    with pytest.raises(ValueError, match="only_two_items_in_row_3.*row 3"):
        env.sample_logged_data(make_key(1), 10)


def test_every_item_excluded_names_the_row():
    def none_in_row_1(context, item_features):
        logits = np.zeros((context.shape[0], D), np.float32)
        logits[1] = -np.inf
        return logits

    with pytest.raises(ValueError, match=r"excluded every item.*row 1"):
        CallableLogging(none_in_row_1, D)(jnp.zeros((4, 2)), None)
