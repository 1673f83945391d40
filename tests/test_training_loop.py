"""The library's host-driven training loop (start / step blocks / end programs) against the
one-scan `train`: the same parameters and history, bit for bit, at sizes that pad the last
block and with epochs spanned several per start (no validation) or one by one (validation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import tuning
from opl_rank.optimization import EpochLoop, TrainConfig, _init_program, run_loop, train


def _loss(params, batch, key, aux):
    noise = 0.01 * jax.random.normal(key, batch["y"].shape)
    return jnp.mean((batch["x"] @ params["w"] + noise - batch["y"]) ** 2)


@pytest.mark.parametrize("n", [70, 1000])
@pytest.mark.parametrize("patience", [None, 2])
def test_run_loop_equals_the_one_scan_bit_for_bit(monkeypatch, n, patience):
    monkeypatch.setattr(tuning, "STEP_BLOCK", 4)  # n = 1000, batch 32: 31 steps, last block padded
    key = jax.random.key(0, impl="philox2x32")
    x = jax.random.normal(key, (n, 5))
    data = {"x": x, "y": x @ jnp.arange(5.0) + 1.0}
    valid = None if patience is None else {"x": x[:50], "y": data["y"][:50] + 0.5}
    config = TrainConfig(epochs=7, batch_size=32, learning_rate=0.05, patience=patience)
    loop = EpochLoop.of(_loss, config, n)
    start = {"w": jnp.zeros(5)}
    state, history = run_loop(loop, _init_program(loop)(start, key), data, valid=valid)
    whole = train(_loss, loop.optimizer, start, data, key, epochs=7, batch_size=32, valid=valid, patience=patience)
    np.testing.assert_array_equal(
        np.asarray(loop.result_params(state, valid is not None)["w"]), np.asarray(whole.params["w"])
    )
    assert not np.allclose(np.asarray(whole.params["w"]), 0.0)  # it trained
    for name in ("train_loss", "active") + (("valid_loss",) if valid is not None else ()):
        np.testing.assert_array_equal(history[name], np.asarray(whole.history[name])[: history[name].shape[-1]])
