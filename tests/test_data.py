"""LoggedData: every validation error names its field; row helpers; persistence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import LoggedData, dcg_position_weights, minibatches, prefix_log_probs, train_val_split


def _valid_arrays(n=8, n_items=5, n_slots=3, seed=0):
    rng = np.random.default_rng(seed)
    ranking = np.stack([rng.permutation(n_items)[:n_slots] for _ in range(n)]).astype(np.int32)
    logits = rng.normal(size=(n, n_items)).astype(np.float32)
    return dict(
        context=rng.normal(size=(n, 4)).astype(np.float32),
        ranking=ranking,
        reward=rng.normal(size=(n, n_slots)).astype(np.float32),
        log_pi0_prefix=np.asarray(prefix_log_probs(jnp.asarray(logits), jnp.asarray(ranking))),
        position_weight=np.asarray(dcg_position_weights(n_slots)),
        n_items=n_items,
    )


def test_valid_data_constructs_and_reports_sizes():
    data = LoggedData(**_valid_arrays())
    assert (data.n_rounds, data.ranking_length, data.n_items, len(data)) == (8, 3, 5, 8)
    summary = data.summary()
    assert summary["n"] == 8 and summary["D"] == 5 and summary["L"] == 3
    assert 0 < summary["pi0_top1_min"] <= summary["pi0_top1_max"] <= 1


def _with(**changes):
    arrays = _valid_arrays()
    arrays.update(changes)
    return arrays


BAD_INPUTS = [
    ("ranking", "integer", lambda a: _with(ranking=a["ranking"].astype(np.float32))),
    ("ranking", r"\[n, L\]", lambda a: _with(ranking=a["ranking"][:, 0])),
    (
        "ranking",
        "in \\[0, 5\\)",
        lambda a: _with(ranking=np.where(a["ranking"] == 0, 7, a["ranking"]).astype(np.int32)),
    ),
    (
        "ranking",
        "in \\[0, 5\\)",
        lambda a: _with(ranking=np.where(a["ranking"] == 0, -1, a["ranking"]).astype(np.int32)),
    ),
    (
        "ranking",
        "repeats an item",
        lambda a: _with(
            ranking=np.concatenate([a["ranking"][:, :1], a["ranking"][:, :1], a["ranking"][:, 2:]], axis=1)
        ),
    ),
    (
        "ranking",
        "no rows",
        lambda a: {k: (v[:0] if isinstance(v, np.ndarray) and k != "position_weight" else v) for k, v in a.items()},
    ),
    ("ranking", "length L=3 must be in", lambda a: _with(n_items=2)),
    ("context", r"\[n=8, dx\]", lambda a: _with(context=a["context"][:5])),
    (
        "context",
        "non-finite",
        lambda a: _with(context=np.where(np.arange(4) == 2, np.nan, a["context"]).astype(np.float32)),
    ),
    ("reward", r"\[n, L\]", lambda a: _with(reward=a["reward"][:, :2])),
    ("reward", "non-finite", lambda a: _with(reward=np.full((8, 3), np.inf, np.float32))),
    ("reward", "non-finite", lambda a: _with(reward=np.full((8, 3), np.nan, np.float32))),
    ("log_pi0_prefix", "<= 0", lambda a: _with(log_pi0_prefix=a["log_pi0_prefix"] + 5.0)),
    ("log_pi0_prefix", "non-finite", lambda a: _with(log_pi0_prefix=np.full((8, 3), -np.inf, np.float32))),
    ("log_pi0_prefix", "non-increasing", lambda a: _with(log_pi0_prefix=a["log_pi0_prefix"][:, ::-1].copy())),
    ("log_pi0_prefix", r"\[n, L\]", lambda a: _with(log_pi0_prefix=a["log_pi0_prefix"].T.copy())),
    ("log_pi0_position_marginal", "<= 0", lambda a: _with(log_pi0_position_marginal=np.full((8, 3), 0.5, np.float32))),
    (
        "log_pi0_position_marginal",
        "non-finite",
        lambda a: _with(log_pi0_position_marginal=np.full((8, 3), np.nan, np.float32)),
    ),
    ("position_weight", "non-negative", lambda a: _with(position_weight=np.array([1.0, -0.5, 0.2], np.float32))),
    ("position_weight", r"\[L\]", lambda a: _with(position_weight=np.ones(4, np.float32))),
    ("position_weight", "required", lambda a: _with(position_weight=None)),
    ("n_items", "positive int", lambda a: _with(n_items=0)),
    ("item_mask", "bool", lambda a: _with(item_mask=np.ones((8, 5), np.float32))),
    ("item_mask", "masked-out", lambda a: _with(item_mask=np.zeros((8, 5), bool))),
    ("item_features", r"\[D, di\]", lambda a: _with(item_features=np.ones((4, 2), np.float32))),
    ("item_features", "non-finite", lambda a: _with(item_features=np.full((5, 2), np.nan, np.float32))),
]


@pytest.mark.parametrize("field,message,make", BAD_INPUTS, ids=[f"{f}:{m}" for f, m, _ in BAD_INPUTS])
def test_every_validation_error_names_the_field(field, message, make):
    with pytest.raises(ValueError, match=f"LoggedData.{field}: .*{message}"):
        LoggedData(**make(_valid_arrays()))


def test_optional_fields_are_validated_when_valid():
    arrays = _valid_arrays()
    data = LoggedData(
        **arrays,
        log_pi0_position_marginal=arrays["log_pi0_prefix"][:, :1].repeat(3, axis=1),
        item_features=np.ones((5, 2), np.float32),
        item_mask=np.ones((8, 5), bool),
    )
    assert data.take(np.arange(3)).item_mask.shape == (3, 5)
    assert data.take(np.arange(3)).item_features.shape == (5, 2)  # shared features stay


def test_jit_and_vmap_pass_tracers_without_validating():
    data = LoggedData(**_valid_arrays())
    total = jax.jit(lambda d: d.reward.sum())(data)
    np.testing.assert_allclose(total, np.asarray(data.reward).sum(), rtol=1e-6)
    # A per-field in_axes spec is itself a LoggedData of ints/None: not validated either.
    spec = data.replace(context=0, ranking=0, reward=0, log_pi0_prefix=0, position_weight=None)
    rows = jax.vmap(lambda d: d.reward @ d.position_weight, in_axes=(spec,))(data)
    np.testing.assert_allclose(rows, np.asarray(data.reward) @ np.asarray(data.position_weight), rtol=1e-6)


def test_take_split_and_minibatches_cover_rows(key):
    data = LoggedData(**_valid_arrays(n=23))
    train, val = train_val_split(data, key, 0.25)
    assert train.n_rounds + val.n_rounds == 23 and val.n_rounds == 6
    seen = np.concatenate([np.asarray(train.context[:, 0]), np.asarray(val.context[:, 0])])
    np.testing.assert_array_equal(np.sort(seen), np.sort(np.asarray(data.context[:, 0])))
    batches = list(minibatches(data, key, 5))
    assert [b.n_rounds for b in batches] == [5, 5, 5, 5]  # drop_last keeps shapes fixed
    kept = list(minibatches(data, key, 5, drop_last=False))
    assert [b.n_rounds for b in kept] == [5, 5, 5, 5, 3]
    firsts = np.concatenate([np.asarray(b.context[:, 0]) for b in kept])
    np.testing.assert_array_equal(np.sort(firsts), np.sort(np.asarray(data.context[:, 0])))
    with pytest.raises(ValueError, match="batch_size"):
        list(minibatches(data, key, 0))
    with pytest.raises(ValueError, match="exceeds the number of rows"):
        list(minibatches(data, key, 50))
    with pytest.raises(ValueError, match="val_fraction"):
        train_val_split(data, key, 1.0)


def test_save_and_load_round_trip(tmp_path):
    arrays = _valid_arrays()
    data = LoggedData(**arrays, item_features=np.eye(5, dtype=np.float32))
    path = tmp_path / "logged.npz"
    data.save(path)
    back = LoggedData.load(path)
    assert back.n_items == 5 and back.log_pi0_position_marginal is None
    for name in ("context", "ranking", "reward", "log_pi0_prefix", "position_weight", "item_features"):
        np.testing.assert_array_equal(np.asarray(getattr(back, name)), np.asarray(getattr(data, name)))
    assert [p.name for p in tmp_path.iterdir()] == ["logged.npz"]  # no temporary file left


def test_dcg_weights():
    np.testing.assert_allclose(dcg_position_weights(4), [1.0, 1 / np.log2(3), 0.5, 1 / np.log2(5)], rtol=1e-6)


# ----------------------------------------------------------- conversion at construction


@pytest.mark.parametrize("field", ["context", "reward", "log_pi0_prefix", "position_weight", "item_features"])
def test_float64_beyond_float32_is_an_error_naming_the_field(field):
    arrays = _valid_arrays()
    if field == "item_features":
        arrays["item_features"] = np.ones((5, 2))
    value = np.array(arrays[field], np.float64)
    value.flat[1] = -1e39 if field == "log_pi0_prefix" else 1e39
    arrays[field] = value
    with pytest.raises(ValueError, match=f"LoggedData.{field}: .*exceed float32.s range \\(~3.4e38"):
        LoggedData(**arrays)


def test_lists_and_wide_dtypes_are_converted_to_the_documented_dtypes():
    arrays = _valid_arrays()
    as_lists = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
    data = LoggedData(**as_lists, item_mask=np.ones((8, 5), bool).tolist())
    assert data.context.dtype == np.float32 and data.reward.dtype == np.float32
    assert data.log_pi0_prefix.dtype == np.float32 and data.position_weight.dtype == np.float32
    assert data.ranking.dtype == np.int32 and data.item_mask.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(data.ranking), arrays["ranking"])
    np.testing.assert_allclose(np.asarray(data.context), arrays["context"])
    wide = LoggedData(
        **{**arrays, "context": arrays["context"].astype(np.float64), "ranking": arrays["ranking"].astype(np.int64)}
    )
    assert wide.context.dtype == np.float32 and wide.ranking.dtype == np.int32
    jax_wide = LoggedData(
        **{**arrays, "reward": jnp.asarray(arrays["reward"]), "ranking": jnp.asarray(arrays["ranking"])}
    )
    assert isinstance(jax_wide.reward, jax.Array) and jax_wide.reward.dtype == jnp.float32


def test_lists_are_validated():
    arrays = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in _valid_arrays().items()}
    arrays["reward"][2][1] = float("nan")
    with pytest.raises(ValueError, match="LoggedData.reward: .*non-finite.*row 2 slot 1"):
        LoggedData(**arrays)
    arrays = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in _valid_arrays().items()}
    arrays["context"][3] = [1.0]  # ragged
    with pytest.raises(ValueError, match="LoggedData.context"):
        LoggedData(**arrays)
    arrays = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in _valid_arrays().items()}
    arrays["ranking"][0][0] = 2**40  # would wrap in int32: reported, not cast
    with pytest.raises(ValueError, match="LoggedData.ranking: item indices must be in"):
        LoggedData(**arrays)


def test_impossible_logged_rankings_name_the_row():
    """A ranked item the logging policy could not place: a -inf prefix log-propensity, or
    an item the mask excludes (e.g. pi_0 had fewer than L candidates)."""
    arrays = _valid_arrays()
    prefix = arrays["log_pi0_prefix"].copy()
    prefix[5, 2:] = -np.inf
    with pytest.raises(ValueError, match=r"LoggedData.log_pi0_prefix: .*non-finite.*row 5 slot 2.*could not place"):
        LoggedData(**{**arrays, "log_pi0_prefix": prefix})
    mask = np.ones((8, 5), bool)
    mask[6, arrays["ranking"][6, 1]] = False
    with pytest.raises(ValueError, match=r"LoggedData.item_mask: row 6 ranks a masked-out item: slot 1"):
        LoggedData(**arrays, item_mask=mask)


@pytest.mark.parametrize("content", [b"", b"not an npz file at all", "truncated"])
def test_load_of_a_bad_file_names_the_path(tmp_path, content):
    path = tmp_path / "logged.npz"
    if content == "truncated":
        LoggedData(**_valid_arrays()).save(path)
        whole = path.read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match="logged.npz"):
        LoggedData.load(path)


def test_load_of_an_npz_without_the_fields_names_the_path(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, x=np.ones(3))
    with pytest.raises(ValueError, match=r"other\.npz.*lacks"):
        LoggedData.load(path)
    with pytest.raises(FileNotFoundError):
        LoggedData.load(tmp_path / "missing.npz")
