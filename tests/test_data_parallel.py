"""Data-parallel training (``TrainConfig.devices``): minibatch rows split over a mesh of
devices give the single-device policy up to float rounding.

The CPU stands in for several accelerators with ``--xla_force_host_platform_device_count=2``,
which must be set before jax is imported: the two-device fits run in a subprocess.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from opl_rank.optimization import TrainConfig, data_mesh, make_optimizer, train_jit

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import json, re
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    from opl_rank import make_key
    from opl_rank.opl.learners import LearnerConfig, fit, fit_seeds
    from opl_rank.optimization import TrainConfig, data_mesh, make_optimizer, train_jit, _partitioner_for
    from simulators import SyntheticRankingEnv

    out = {"device_count": jax.device_count()}
    env = SyntheticRankingEnv.create(make_key(0), n_items=6, ranking_length=3)
    data = env.sample_logged_data(make_key(1), 512)

    def config(method, k, devices):
        return LearnerConfig(method, k=k, n_samples=4,
                             train=TrainConfig(epochs=3, batch_size=64, learning_rate=0.05, devices=devices),
                             reward_train=TrainConfig(epochs=3, batch_size=64, learning_rate=0.02, devices=devices))

    def leaves(policy):
        parts = [policy.first_stage.params if hasattr(policy, "first_stage") else policy.params]
        if getattr(policy, "reward_model", None) is not None:
            parts.append(policy.reward_model.params)
        return jax.tree.leaves(parts)

    for method, k in (("ips", None), ("rpod", 1)):
        one = leaves(fit(data, make_key(2), config(method, k, None)))
        two = leaves(fit(data, make_key(2), config(method, k, 2)))
        out[method] = {
            "max_abs_diff": max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(one, two)),
            "max_abs": max(float(jnp.max(jnp.abs(a))) for a in one),
            "devices_of_params": sorted({len(x.sharding.device_set) for x in two}),
            "values_one": [float(x) for a in one for x in np.ravel(a)[:5]],
            "values_two": [float(x) for a in two for x in np.ravel(a)[:5]],
        }

    # vmapped seeds (fit_seeds) on two devices
    datas = [data, env.sample_logged_data(make_key(3), 512)]
    keys = jnp.stack([make_key(4), make_key(5)])
    one = [leaves(p) for p in fit_seeds(datas, keys, config("ips", None, None))]
    two = [leaves(p) for p in fit_seeds(datas, keys, config("ips", None, 2))]
    out["fit_seeds_max_abs_diff"] = max(float(jnp.max(jnp.abs(a - b))) for s, t in zip(one, two) for a, b in zip(s, t))

    # the compiled step really splits every batch of 16 rows into 8 per device
    rows = {"x": jnp.ones((64, 3), jnp.float32)}
    loss = lambda p, b, k, aux: jnp.mean((b["x"] @ p) ** 2)
    with _partitioner_for(make_key(0)):
        text = train_jit.lower(loss, make_optimizer("adam", 0.1), jnp.ones(3, jnp.float32), rows, make_key(0),
                               epochs=1, batch_size=16, devices=2).compile().as_text()
    out["per_device_batch"] = sorted({int(m) for m in re.findall(r"f32\\[(\\d+),3\\]", text)})
    out["all_reduce"] = "all-reduce" in text
    out["mesh_size"] = data_mesh("all").size
    try:
        train_jit(loss, make_optimizer("adam", 0.1), jnp.ones(3, jnp.float32), rows, make_key(0),
                  epochs=1, batch_size=15, devices=2)
        out["odd_batch_error"] = None
    except ValueError as error:
        out["odd_batch_error"] = str(error)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def two_devices():
    env = {
        **os.environ,
        "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip(),
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.extended
@pytest.mark.parametrize("method", ["ips", "rpod"])
@pytest.mark.slow
def test_two_devices_learn_the_single_device_policy(two_devices, method):
    assert two_devices["device_count"] == 2
    result = two_devices[method]
    assert result["devices_of_params"] == [2]  # the sharded fit's parameters live on both devices
    assert result["max_abs_diff"] <= 1e-4 * max(1.0, result["max_abs"]), result
    assert result["values_one"] == pytest.approx(result["values_two"], rel=1e-4, abs=1e-5)


@pytest.mark.extended
@pytest.mark.slow
def test_vmapped_seeds_on_two_devices(two_devices):
    assert two_devices["fit_seeds_max_abs_diff"] < 1e-4


@pytest.mark.extended
@pytest.mark.slow
def test_batches_are_split_over_the_devices(two_devices):
    assert 8 in two_devices["per_device_batch"] and 16 not in two_devices["per_device_batch"]
    assert two_devices["all_reduce"]
    assert two_devices["mesh_size"] == 2


@pytest.mark.extended
@pytest.mark.slow
def test_batch_not_divisible_by_the_devices_is_an_error(two_devices):
    message = two_devices["odd_batch_error"]
    assert message is not None and "batch_size=15" in message and "2 devices" in message


def test_default_is_one_device_and_unchanged(key):
    assert TrainConfig().devices is None and data_mesh(None) is None
    rows = {"x": jnp.ones((32, 2), jnp.float32)}
    loss = lambda p, b, k, aux: jnp.mean((b["x"] @ p) ** 2)
    args = (loss, make_optimizer("adam", 0.1), jnp.ones(2, jnp.float32), rows, key)
    default = train_jit(*args, epochs=2, batch_size=8)
    explicit = train_jit(*args, epochs=2, batch_size=8, devices=None)
    assert jnp.array_equal(default.params, explicit.params)
    one = train_jit(*args, epochs=2, batch_size=8, devices=1)  # a mesh of one device
    assert jnp.allclose(one.params, default.params, rtol=1e-6)


@pytest.mark.parametrize("devices", [0, -1, 1.5, True, "two"])
def test_bad_devices_value(devices):
    with pytest.raises(ValueError, match="devices"):
        TrainConfig(devices=devices)


def test_more_devices_than_visible():
    with pytest.raises(ValueError, match=f"devices={jax.device_count() + 1} but only"):
        data_mesh(jax.device_count() + 1)
