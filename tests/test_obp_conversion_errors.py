"""obp slate feedback -> LoggedData: inputs that would convert silently wrong fail loudly
(needs only numpy: the feedback dicts are built with ``to_obp_slate``, obp is not imported)."""

import numpy as np
import pytest

from opl_rank import make_key
from opl_rank.io.obp import from_obp_slate, to_obp_slate
from simulators import SyntheticRankingEnv

N, D, L = 20, 6, 3


@pytest.fixture(scope="module")
def feedback():
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L)
    return to_obp_slate(env.sample_logged_data(make_key(1), N))


def test_integral_float_action_ids_are_accepted(feedback):
    fb = dict(feedback, action=feedback["action"].astype(np.float64), n_rounds=float(N))
    data = from_obp_slate(fb)
    np.testing.assert_array_equal(np.asarray(data.ranking).reshape(-1), feedback["action"])


def test_non_integer_action_ids_are_an_error_not_truncated(feedback):
    action = feedback["action"].astype(np.float64)
    action[4] += 0.7  # round 1, slot 1
    with pytest.raises(ValueError, match=r"'action'.*integer ids; round 1 slot 1 holds .*not truncated"):
        from_obp_slate(dict(feedback, action=action))
    action = feedback["action"].astype(np.float64)
    action[0] = np.nan
    with pytest.raises(ValueError, match="'action'.*integer"):
        from_obp_slate(dict(feedback, action=action))


def test_context_with_one_row_per_slot_is_an_error_naming_the_shape(feedback):
    per_slot = np.repeat(feedback["context"], L, axis=0)  # [n * L, dx]
    with pytest.raises(ValueError, match=rf"'context'.*\({N}, dim_context\).*got \({N * L}, .*one per slot"):
        from_obp_slate(dict(feedback, context=per_slot))
    with pytest.raises(ValueError, match="'context'"):
        from_obp_slate(dict(feedback, context=feedback["context"][:5]))
    one_feature = from_obp_slate(dict(feedback, context=feedback["context"][:, 0]))  # [n]: one feature per round
    assert one_feature.context.shape == (N, 1)


@pytest.mark.parametrize("n_rounds", [0, -3, 2.5, "20", None])
def test_bad_n_rounds_is_a_clear_error(feedback, n_rounds):
    with pytest.raises(ValueError, match="n_rounds"):
        from_obp_slate(dict(feedback, n_rounds=n_rounds))


def test_slate_arrays_of_the_wrong_length(feedback):
    with pytest.raises(ValueError, match="slate_id"):
        from_obp_slate(dict(feedback, n_rounds=N * L + 1))
    with pytest.raises(ValueError, match="slate_id"):
        from_obp_slate(dict(feedback, slate_id=feedback["slate_id"][:0]))
