"""The program cache (opl_rank.program_cache): a later process loads a fit's traced programs
and gets the same numbers, bit for bit; keys see closed-over values; user code, a source file
changed after the process started and a damaged entry all fall back to tracing."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opl_rank import program_cache, staging
from opl_rank.compilation_cache import CACHE_ENV, enable_compilation_cache
from opl_rank.optimization import EpochLoop, TrainConfig
from tests.test_compilation_cache import _clean_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The program cache on, in a folder of its own, for one test (the process's state restored)."""
    monkeypatch.setenv(program_cache.PROGRAM_CACHE_ENV, "1")
    for name in ("_dir", "_disabled_reason", "_SOURCES_AT_START", "_bindings_seen"):
        monkeypatch.setattr(program_cache, name, getattr(program_cache, name))
    monkeypatch.setattr(program_cache, "_programs", {})
    monkeypatch.setattr(program_cache, "_counts", dict.fromkeys(program_cache._counts, 0))
    monkeypatch.setattr(program_cache, "_bindings_seen", None)  # its own state just changed
    path = tmp_path / "programs"
    assert program_cache.enable_program_cache(path) == str(path)
    return path


def _loss(params, batch, key, aux):
    return jnp.mean((batch @ params - 1.0) ** 2)


def test_keys_see_closed_over_values_and_refuse_user_code():
    def loop(learning_rate, loss=jnp.sum):
        return EpochLoop.of(loss, TrainConfig(epochs=2, batch_size=8, learning_rate=learning_rate), 16)

    first = program_cache.fingerprint(loop(0.05).steps.run)
    assert first is not None
    assert program_cache.fingerprint(loop(0.05).steps.run) == first  # equal settings, separate objects
    assert program_cache.fingerprint(loop(0.1).steps.run) != first  # the optimiser's closed-over rate
    assert program_cache.fingerprint(jnp.sum) != program_cache.fingerprint(jnp.mean)
    assert program_cache.fingerprint(jnp.ones(3)) != program_cache.fingerprint(jnp.array([1.0, 1.0, 2.0]))
    # code outside the repository's packages and the pinned libraries cannot be keyed
    assert program_cache.fingerprint(loop(0.05, loss=_loss).steps.run) is None
    assert program_cache.fingerprint(lambda x: x) is None


def test_disguises_weak_types_and_settings_are_keyed():
    @functools.wraps(jnp.cumsum)  # claims jax.numpy's __module__; runs in this module's globals
    def disguised(x):
        return jnp.cumsum(x) * 2.0

    assert program_cache.fingerprint(disguised) is None
    weak, strong = jnp.asarray(1.0), jnp.asarray(np.float32(1.0))
    assert weak.weak_type and not strong.weak_type
    assert program_cache.fingerprint(functools.partial(jnp.where, True, weak)) != program_cache.fingerprint(
        functools.partial(jnp.where, True, strong)
    )
    plain = program_cache._environment()
    with jax.enable_x64(True):
        assert program_cache._environment() != plain


def test_what_the_reviews_found_stays_closed(cache, monkeypatch):
    import types

    import flax.linen as nn

    from opl_rank.opl import policies

    # a package that only shares a name with the repository's is user code
    fake = types.ModuleType("experiments.not_ours")
    fake.__file__ = "/elsewhere/experiments/not_ours.py"
    monkeypatch.setitem(sys.modules, "experiments.not_ours", fake)
    assert not program_cache._allowed_module("experiments.not_ours")
    import experiments.sweep_cell  # noqa: F401 -- imported: judged by its file

    assert program_cache._allowed_module("experiments.sweep_cell")
    # a bound flax module carries variables that are not fields
    dense = nn.Dense(2)
    variables = dense.init(jax.random.key(0), jnp.ones((1, 3)))
    assert program_cache.fingerprint(dense) is not None and program_cache.fingerprint(dense.bind(variables)) is None
    # a dynamic argument left to its default stays a Python constant (as jax.jit has it)
    total = program_cache.cached_jit(jnp.sum)
    assert float(total(jnp.ones(3))) == 3.0
    assert program_cache.stats()["exported"] == 1 and program_cache.stats()["failed"] == 0
    # under jax.disable_jit nothing is compiled, so nothing is cached
    with jax.disable_jit():
        assert float(program_cache.cached_jit(jnp.prod)(jnp.ones(2))) == 1.0
    assert program_cache.stats()["exported"] == 1
    # a tracer closed over inside an enclosing jit: traced as usual
    outer = jax.jit(lambda a, x: staging.stage.__wrapped__(functools.partial(jnp.add, a), False)(x))
    assert np.array_equal(outer(jnp.ones(2), jnp.ones(2)), [2.0, 2.0])
    # a constant or a method rebound after the first look, by anything, turns the cache off
    assert program_cache._patched_function() is None
    monkeypatch.setattr(policies, "MIN_MARGINAL", policies.MIN_MARGINAL / 2)
    assert program_cache._patched_function() == "opl_rank.opl.policies.MIN_MARGINAL"
    monkeypatch.undo()


def test_a_method_rebound_after_the_first_look_turns_the_cache_off(cache, monkeypatch):
    from opl_rank.opl import policies

    assert program_cache._patched_function() is None
    monkeypatch.setattr(policies.PLPolicy, "sample", jax.jit(policies.PLPolicy.sample))
    assert program_cache._patched_function() == "opl_rank.opl.policies.PLPolicy.sample"


def test_a_closure_changed_between_calls_gets_its_own_program(cache):
    total = functools.partial(jnp.sum, axis=0)
    staged = staging.stage.__wrapped__(total, False)
    assert staged(jnp.ones((4, 5))).shape == (5,)
    total.keywords["axis"] = 1  # the same object, another program from here on
    assert staged(jnp.ones((4, 6))).shape == (4,)
    program_cache._programs.clear()  # a new process with the first closure again
    assert staging.stage.__wrapped__(functools.partial(jnp.sum, axis=0), False)(jnp.ones((4, 6))).shape == (6,)


def test_a_staged_program_is_exported_once_then_loaded(cache):
    x = jnp.arange(12.0)
    fresh = staging.stage.__wrapped__  # not the process's lru-cached stages
    want = np.cumsum(np.arange(12.0))
    results = []
    threads = [threading.Thread(target=lambda: results.append(fresh(jnp.cumsum, False)(x))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(r, want) for r in results)
    assert program_cache.stats()["exported"] == 1  # two threads, one export
    assert len(list(cache.iterdir())) == 1
    program_cache._programs.clear()  # as in a new process
    assert np.array_equal(fresh(jnp.cumsum, False)(x), want)
    assert program_cache.stats()["loaded"] == 1


@jax.tree_util.register_pytree_node_class
class _Box:
    """A user's pytree node: its static data cannot be keyed."""

    def __init__(self, x, tag="a"):
        self.x, self.tag = x, tag

    def tree_flatten(self):
        return [self.x], self.tag

    @classmethod
    def tree_unflatten(cls, tag, leaves):
        return cls(leaves[0], tag)


def test_static_arguments_are_part_of_the_key(cache):
    cumsum = program_cache.cached_jit(jnp.cumsum, static_argnames=("axis",))
    x = jnp.arange(6.0).reshape(2, 3)
    for axis in (0, 1, 0):
        assert np.array_equal(cumsum(x, axis=axis), np.cumsum(np.arange(6.0).reshape(2, 3), axis=axis))
    assert program_cache.stats()["exported"] == 2 and len(list(cache.iterdir())) == 2
    program_cache._programs.clear()
    fresh = program_cache.cached_jit(jnp.cumsum, static_argnames=("axis",))
    assert np.array_equal(fresh(x, 1), np.cumsum(np.arange(6.0).reshape(2, 3), axis=1))  # positional static too
    assert program_cache.stats()["loaded"] == 1
    assert fresh._cache_size() == 0  # the jitted function's own methods are there; it never traced


def test_a_static_argument_is_keyed_by_content_not_by_its_repr(cache):
    # a static function's repr holds its address, which differs from process to process (an
    # OPE estimator's entry holds one): the key must not, or every process exports it again
    import types

    from opl_rank.pl.plackett_luce import safe_logsumexp as row_lse

    twin = types.FunctionType(row_lse.__code__, row_lse.__globals__, row_lse.__name__, row_lse.__defaults__)
    assert repr(twin) != repr(row_lse) and program_cache.fingerprint(twin) == program_cache.fingerprint(row_lse)
    rows = jnp.arange(6.0).reshape(2, 3)
    first = program_cache.cached_jit(jax.lax.map, static_argnames=("f",))(row_lse, rows)
    program_cache._programs.clear()  # as a new process starts
    again = program_cache.cached_jit(jax.lax.map, static_argnames=("f",))(twin, rows)
    assert np.array_equal(first, again)
    assert program_cache.stats()["exported"] == 1 and program_cache.stats()["loaded"] == 1


def test_the_least_recently_used_programs_are_removed_beyond_the_limit(cache, monkeypatch):
    import time

    from opl_rank import tuning

    def run(f):  # in a "new process": nothing in memory, so the entry is loaded (and marked used)
        program_cache._programs.clear()
        program_cache.cached_jit(f)(jnp.ones(3))
        time.sleep(0.02)  # modification times apart

    monkeypatch.setattr(tuning, "PROGRAM_CACHE_MAX_ENTRIES", 4)
    for f in (jnp.cumsum, jnp.cumprod, jnp.sort, jnp.cumsum, jnp.argsort):
        run(f)
    assert len(list(cache.iterdir())) == 4 and program_cache.stats()["loaded"] == 1
    run(jnp.diff)  # a fifth entry: the two least recently used (cumprod, sort) go
    assert len(list(cache.iterdir())) == 3
    before = program_cache.stats()
    for f in (jnp.cumsum, jnp.argsort, jnp.diff):
        run(f)
    assert program_cache.stats()["loaded"] == before["loaded"] + 3  # the used one stayed
    run(jnp.sort)
    assert program_cache.stats()["exported"] == before["exported"] + 1  # removed: exported again


def test_user_code_is_traced_as_usual(cache):
    out = staging.stage.__wrapped__(_loss, False)(jnp.ones(3), jnp.ones((4, 3)), jax.random.key(0), None)
    assert float(out) == 4.0
    (leaf,) = staging.stage.__wrapped__(jax.tree.leaves, False)(_Box(jnp.ones(2)))  # a library function, a user node
    assert np.array_equal(leaf, [1.0, 1.0])
    assert program_cache.stats()["uncacheable"] == 2 and not any(cache.iterdir())


def test_a_source_file_changed_after_start_turns_the_cache_off(cache, monkeypatch):
    monkeypatch.setattr(program_cache, "_SOURCES_AT_START", "the sources as another version had them")
    assert np.array_equal(staging.stage.__wrapped__(jnp.cumsum, False)(jnp.ones(4)), [1.0, 2.0, 3.0, 4.0])
    assert program_cache.stats()["exported"] == 0 and not any(cache.iterdir())
    assert "changed after this process started" in program_cache._disabled_reason


def test_the_source_hash_sees_an_edit_that_keeps_size_and_modification_time(monkeypatch, tmp_path):
    # the hash rereads a file only where its stat moved; the change time moves on every write
    package = tmp_path / "opl_rank"
    package.mkdir()
    source = package / "module.py"
    source.write_text("SCALE = 1\n")
    monkeypatch.setattr(program_cache, "_package_dirs", lambda: [str(package)])
    monkeypatch.setattr(program_cache, "_sources_memo", None)
    first = program_cache._hash_sources()
    assert program_cache._hash_sources() == first  # from the memo
    before = os.stat(source)
    source.write_text("SCALE = 2\n")  # same size
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))  # modification time put back
    assert os.stat(source).st_size == before.st_size and os.stat(source).st_mtime_ns == before.st_mtime_ns
    edited = program_cache._hash_sources()
    assert edited != first
    (package / "new.py").write_text("")  # a new file
    assert program_cache._hash_sources() not in (first, edited)


def test_global_stores_read_from_wordcode_match_dis():
    import dis
    import types

    import experiments.opl_sweep  # noqa: F401 -- more modules to read

    def stored(code):
        found = {i.argval for i in dis.get_instructions(code) if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")}
        return found.union(*(stored(c) for c in code.co_consts if isinstance(c, types.CodeType)))

    seen = 0
    for _, module in program_cache._own_modules():
        functions = [
            v for v in vars(module).values() if isinstance(v, types.FunctionType) and v.__globals__ is vars(module)
        ]
        expected = set().union(*(stored(f.__code__) for f in functions))
        assert program_cache._global_stores(module) == expected, module.__name__
        seen += len(expected)
    assert seen > 0  # the library's own state (e.g. program_cache._disabled_reason) is found


def test_a_library_function_replaced_by_outside_code_turns_the_cache_off(cache, monkeypatch):
    from opl_rank import metrics

    monkeypatch.setattr(metrics, "dcg_position_weights", lambda n: jnp.ones(n))  # as a test's monkeypatch
    assert np.array_equal(staging.stage.__wrapped__(jnp.cumsum, False)(jnp.ones(2)), [1.0, 2.0])
    assert not any(cache.iterdir())
    assert "opl_rank.metrics.dcg_position_weights" in program_cache._disabled_reason
    monkeypatch.setattr(program_cache, "_disabled_reason", None)
    monkeypatch.setattr(metrics, "dcg_position_weights", functools.partial(_loss, jnp.ones(2)))  # as a partial
    assert program_cache._patched_function() == "opl_rank.metrics.dcg_position_weights"


def test_transformed_and_weakly_typed_uses_are_traced_as_usual(cache):
    staged = staging.stage.__wrapped__(jnp.cumsum, False)
    rows = jnp.arange(6.0).reshape(2, 3)
    assert np.array_equal(jax.vmap(staged)(rows), np.cumsum(np.arange(6.0).reshape(2, 3), axis=1))  # tracers
    assert not any(cache.iterdir())
    weak = staging.stage.__wrapped__(jnp.sinc, False)(0.0)  # a Python scalar: a weakly typed result
    assert float(weak) == 1.0 and weak.weak_type  # as jax.jit gives it
    assert program_cache.stats()["failed"] == 1 and not any(cache.iterdir())


def test_a_damaged_entry_is_exported_again(cache):
    x = jnp.arange(5.0)
    assert np.array_equal(staging.stage.__wrapped__(jnp.cumsum, False)(x), np.cumsum(np.arange(5.0)))
    (entry,) = cache.iterdir()
    entry.write_bytes(b"not a program")
    program_cache._programs.clear()
    assert np.array_equal(staging.stage.__wrapped__(jnp.cumsum, False)(x), np.cumsum(np.arange(5.0)))
    assert program_cache.stats()["exported"] == 2
    program_cache._programs.clear()
    staging.stage.__wrapped__(jnp.cumsum, False)(x)
    assert program_cache.stats()["loaded"] == 1  # the entry was written again, whole


def test_the_compilation_cache_switch_turns_programs_on_beside_it(monkeypatch):
    here = os.environ[CACHE_ENV]  # conftest's compilation cache: JAX's setting does not change
    if not here:
        pytest.skip("the compilation cache is off in this run")
    monkeypatch.setattr(program_cache, "_dir", program_cache._dir)
    monkeypatch.setenv(program_cache.PROGRAM_CACHE_ENV, "1")
    enable_compilation_cache(here)
    assert program_cache.program_cache_dir() == os.path.join(here, "programs")
    enable_compilation_cache(here, programs=False)
    assert program_cache.program_cache_dir() is None
    monkeypatch.setenv(program_cache.PROGRAM_CACHE_ENV, "0")
    enable_compilation_cache(here)
    assert program_cache.program_cache_dir() is None


# One R-POD fit (a reward model, a two-stage policy, PRNG keys through every stage) and its
# true value; the program cache's counts.
FIT_SCRIPT = """
import json, sys
from opl_rank import make_key, program_cache
from opl_rank.compilation_cache import enable_compilation_cache
from opl_rank.opl.learners import LearnerConfig, fit
from opl_rank.optimization import TrainConfig
from simulators import SyntheticRankingEnv
enable_compilation_cache(sys.argv[1])
env = SyntheticRankingEnv.create(make_key(0), n_items=5, ranking_length=3, lam=0.5)
data = env.sample_logged_data(make_key(1), 200)
train = TrainConfig(epochs=2, batch_size=64, learning_rate=0.05)
policy = fit(data, make_key(2), LearnerConfig("rpod", k=1, train=train, reward_train=train, n_samples=4))
value = env.policy_value(policy, make_key(3), 2000)
print(json.dumps({"value": repr(value.value), "stderr": repr(value.stderr), **program_cache.stats()}))
"""


def _fit_run(cache_dir: Path, programs: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", FIT_SCRIPT, str(cache_dir)],
        cwd=ROOT,
        env=_clean_env(**{program_cache.PROGRAM_CACHE_ENV: programs}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.extended  # a second Python process (the cross-process cache)
def test_a_later_process_loads_a_fits_programs_and_gets_the_same_numbers(tmp_path):
    cold = _fit_run(tmp_path, "1")
    warm = _fit_run(tmp_path, "1")
    assert cold["exported"] > 0 and cold["loaded"] == 0 and cold["failed"] == cold["uncacheable"] == 0
    assert warm["loaded"] == cold["exported"] and warm["exported"] == 0
    assert len(list((tmp_path / "programs").iterdir())) == cold["exported"]
    plain = _fit_run(tmp_path / "off", "0")  # traced as usual
    assert plain["exported"] == plain["loaded"] == 0
    assert cold["value"] == warm["value"] == plain["value"] and cold["stderr"] == warm["stderr"] == plain["stderr"]


def test_cpu_programs_get_the_cpu_options_and_small_ones_the_fast_ones(monkeypatch):
    from opl_rank import tuning

    monkeypatch.setenv("XLA_FLAGS", "")
    cpu, fast = tuning.CPU_COMPILE_OPTIONS, tuning.FAST_COMPILE_OPTIONS
    small, large = [jnp.zeros((4, 8)), jax.random.key(0)], [jnp.zeros(tuning.FAST_COMPILE_MAX_ELEMENTS + 1)]
    assert program_cache.compiler_options(small) == cpu + fast
    assert program_cache.compiler_options(small, hot=True) == cpu  # a hot program: never the cheap ones
    assert program_cache.compiler_options(large) == cpu
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")  # XLA_FLAGS keeps what it names
    assert program_cache.compiler_options(small) == cpu + (("xla_cpu_use_fusion_emitters", False),)
    monkeypatch.setattr(tuning, "FAST_COMPILE_MAX_ELEMENTS", 0)
    assert program_cache.compiler_options(small) == cpu
    monkeypatch.setattr(tuning, "CPU_COMPILE_OPTIONS", ())
    assert program_cache.compiler_options(small) is None
    # an option this jaxlib does not know (or not with that value) is dropped, not an error
    monkeypatch.setattr(tuning, "CPU_COMPILE_OPTIONS", (("xla_cpu_no_such_option", 1),) + cpu)
    assert program_cache.compiler_options(large) == cpu


def test_a_hot_and_a_cheap_program_of_one_function_are_two_programs(cache, monkeypatch):
    """A training step never sees n: a small fit (cheap options) and a large one (hot) share its
    signature, and each must still compile with its own options, whichever ran first."""
    monkeypatch.setenv("XLA_FLAGS", "")
    x = jnp.linspace(0.0, 3.0, 64).reshape(8, 8)
    fn = functools.partial(jnp.linalg.norm, axis=1)
    cheap, hot = program_cache.cached_program(fn, fn, "t"), program_cache.cached_program(fn, fn, "t", hot=True)
    assert cheap._options([x]) != hot._options([x])
    np.testing.assert_array_equal(hot(x), cheap(x))
    assert program_cache.stats()["exported"] == 2 and len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("programs", [False, True])
def test_the_options_reach_the_compiler_and_keep_the_values(cache, monkeypatch, programs):
    from opl_rank import tuning

    monkeypatch.setenv("XLA_FLAGS", "")  # the tests' own flags name every option
    monkeypatch.setattr(program_cache, "_known_options", lambda options: options)  # no probe: reach XLA
    if not programs:
        monkeypatch.setattr(program_cache, "_dir", None)
    x = jnp.linspace(0.0, 3.0, 64).reshape(8, 8)
    fresh = staging.stage.__wrapped__
    fn = functools.partial(jnp.linalg.norm, axis=1)
    got = fresh(fn, False)(x)
    np.testing.assert_allclose(got, jax.jit(fn)(x), rtol=1e-6)
    monkeypatch.setattr(tuning, "FAST_COMPILE_OPTIONS", (("xla_cpu_use_fusion_emitters", "maybe"),))
    with pytest.raises(Exception, match="xla_cpu_use_fusion_emitters"):  # compiled with them, on either path
        fresh(fn, False)(x + 1.0)
