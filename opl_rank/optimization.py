"""The one minibatch training loop: reward models, OPL policies, LTR and pairwise rankers.

[`train`][train] is a pure function of arrays -- the whole run (epochs of shuffled fixed-size
batches, optax steps, optional early stopping on a validation loss) is one ``lax.scan`` --
so it can be ``jax.jit``-ed, and ``jax.vmap``-ed over seeds. The library's own fits
([`minimize`][minimize], [`opl_rank.opl.learners.fit`][opl_rank.opl.learners.fit]) run the same
epochs driven from the host ([`EpochLoop`][EpochLoop], [`run_loop`][run_loop]) as three
programs free of host callbacks, so JAX's persistent compilation cache keeps them for the
next process: an epoch's start (shuffle, cut into blocks of ``tuning.STEP_BLOCK`` batches;
[`EpochStart`][EpochStart]), its steps block by block ([`StepBlock`][StepBlock]: one program
per loss and optimiser that never sees the data's size, so it serves every ``n``) and its end
(validation, early stopping; [`EpochEnd`][EpochEnd]). The host reports progress and checks for
early stopping after every chunk of epochs (at most ``tuning.CHUNK_STEPS`` optimiser steps).
In one scan or as programs, watched or not, the parameters are the same, bit for bit: every
epoch draws its keys from the carried key, and the programs are the pieces of the scan.

An epoch shuffles the rows and cuts them into ``n // batch`` batches of exactly ``batch``
rows (the remainder of the shuffle is skipped). Early stopping: after each epoch the
validation loss is computed; after ``patience`` epochs without a lower one the run stops
(the remaining epochs do nothing) and the parameters with the lowest validation loss are
returned.

Data parallel (``TrainConfig.devices``, ``train(..., devices=...)``): every minibatch's rows
are split over a 1-D ``jax.sharding.Mesh`` of devices (axis ``"data"``) by XLA's automatic
SPMD partitioning -- the batch is constrained to ``PartitionSpec("data")`` on its row axis,
while the parameters, the optimiser state, the keys and the logged data (from which each
device gathers its rows of every shuffled batch) are replicated; the gradient is
all-reduced by the compiler. Off by default (``devices=None``: one device, exactly the
results of a run without this option). docs/performance.md §10.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from opl_rank import prng, tuning
from opl_rank.data import LoggedData
from opl_rank.program_cache import small_arguments
from opl_rank.staging import leading_rows, pack, stage, unpack

__all__ = [
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "EpochLoop",
    "EpochStart",
    "StepBlock",
    "EpochEnd",
    "init_state",
    "train_epochs",
    "chunk_epochs",
    "run_loop",
    "make_optimizer",
    "train",
    "train_jit",
    "minimize",
    "listen",
    "print_epoch",
    "OPTIMIZERS",
    "data_mesh",
]

LossFn = Callable[[Any, Any, jax.Array, Any], jax.Array]  # (params, batch, key, aux) -> scalar

OPTIMIZERS = ("adam", "adamax", "adamw", "sgd")

# Step keys are drawn for this many steps per block, so that a run's random numbers do not
# depend on how the loop is cut (results are reproducible across versions of this loop).
_KEY_BLOCK = 16


@functools.lru_cache(maxsize=256)
def make_optimizer(name: str, learning_rate: float, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """An optax optimiser by name; one object per setting, so compiled runs are reused.

    Args:
      name: one of [`OPTIMIZERS`][OPTIMIZERS].
      learning_rate: step size (> 0).
      weight_decay: decoupled weight decay (``adamw`` only).
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if name == "adamw":
        return optax.adamw(learning_rate, weight_decay=weight_decay)
    if weight_decay:
        raise ValueError(f"weight_decay is for adamw only, got {weight_decay} with {name!r}")
    return getattr(optax, name)(learning_rate)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
      epochs: maximum passes over the data.
      batch_size: rows per step; capped at ``n`` (so ``n`` smaller than a batch trains on
        full-data batches instead of failing).
      learning_rate: step size.
      patience: stop after this many epochs without a lower validation loss (None: no
        early stopping); the best parameters are returned. Needs validation rows.
      progress: print one line per epoch to stderr.
      optimizer: a name in [`OPTIMIZERS`][OPTIMIZERS] (``minimize(..., optimizer=...)`` takes any
        ``optax.GradientTransformation`` instead).
      weight_decay: decoupled weight decay (``adamw``).
      devices: data parallelism. None (default): one device, as without this option. An
        int ``m`` or ``"all"`` (every visible device, ``jax.device_count()``): each
        minibatch's rows are sharded over a 1-D mesh of the first ``m`` devices of
        ``jax.devices()`` (axis ``"data"``); parameters, optimiser state and the logged
        data are replicated on them, gradients are all-reduced by XLA. The batch
        (``batch_size`` capped at ``n``) must be divisible by ``m`` (a ValueError otherwise;
        no padding, which would change the estimator). Same estimator and same random
        numbers: the learned parameters match one device's up to float rounding (sums are
        reduced in another order). ``m = 1`` is a mesh of one device. Learners train
        f_hat with ``LearnerConfig.reward_train``: set ``devices`` there too.
    """

    epochs: int = 30
    batch_size: int = 256
    learning_rate: float = 1e-2
    patience: int | None = None
    progress: bool = False
    optimizer: str = "adam"
    weight_decay: float = 0.0
    devices: int | str | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (
            isinstance(self.learning_rate, (int, float))
            and self.learning_rate > 0
            and math.isfinite(self.learning_rate)
        ):
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.patience is not None and (
            not isinstance(self.patience, int) or isinstance(self.patience, bool) or self.patience < 1
        ):
            raise ValueError(f"patience must be None or a positive int, got {self.patience!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.weight_decay and self.optimizer != "adamw":
            raise ValueError(f"weight_decay is for optimizer 'adamw', got optimizer {self.optimizer!r}")
        _check_devices(self.devices)

    def make_optimizer(self) -> optax.GradientTransformation:
        return make_optimizer(self.optimizer, float(self.learning_rate), float(self.weight_decay))


class TrainResult(NamedTuple):
    """Parameters and the per-epoch history.

    ``history`` is a list of dicts (``epoch``, ``train_loss``, ``valid_loss`` with
    validation rows, plus ``metrics_fn``'s values) from [`minimize`][minimize]; from [`train`][train]
    it is a dict of ``[epochs]`` arrays (with ``active``: the epoch ran) -- pure, vmappable.
    """

    params: Any
    history: Any


def _check_devices(devices: Any) -> None:
    if devices is None or devices == "all":
        return
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices must be None, 'all' or a positive int, got {devices!r}")


@functools.lru_cache(maxsize=16)
def data_mesh(devices: int | str | None) -> jax.sharding.Mesh | None:
    """The 1-D mesh (axis ``"data"``) of the first ``devices`` devices of ``jax.devices()``
    (``"all"``: every one); None for ``devices=None`` (no data parallelism)."""
    _check_devices(devices)
    if devices is None:
        return None
    available = jax.devices()
    if devices == "all":
        count = len(available)
    else:
        assert isinstance(devices, int)  # _check_devices: None, "all" or a positive int
        count = devices
    if count > len(available):
        raise ValueError(
            f"devices={devices} but only {len(available)} {available[0].platform} device(s) are visible "
            "(CPU: set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax)"
        )
    return jax.sharding.Mesh(np.array(available[:count]), ("data",))


def _shard_rows(tree: Any, mesh: jax.sharding.Mesh | None, axis: int) -> Any:
    """Constrain every leaf's ``axis`` (the rows of a batch) to the mesh's ``"data"`` axis."""
    if mesh is None:
        return tree
    spec = jax.sharding.PartitionSpec(*([None] * axis), "data")
    return jax.lax.with_sharding_constraint(tree, jax.sharding.NamedSharding(mesh, spec))


def _replicate(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """Concrete arrays of ``tree`` replicated on every device of the mesh (tracers as they are)."""
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(x: Any) -> Any:
        if isinstance(x, (jax.Array, np.ndarray)) and not isinstance(x, jax.core.Tracer):
            return jax.device_put(x, replicated)
        return x

    return jax.tree.map(put, tree)


_EXTRA = "extra/"  # row names of the per-row extras in a (LoggedData, extras) pair


def _rows_of(data: Any) -> dict[str, jax.Array]:
    if isinstance(data, tuple):  # (LoggedData, {name: [n, ..]}): logged rows and per-row extras
        logged, extras = data
        return {**logged.row_fields(), **{_EXTRA + name: value for name, value in extras.items()}}
    return data.row_fields() if isinstance(data, LoggedData) else dict(data)


def _with_rows(data: Any, rows: dict[str, jax.Array]) -> Any:
    if isinstance(data, tuple):
        logged, extras = data
        extra_rows = {name[len(_EXTRA) :]: value for name, value in rows.items() if name.startswith(_EXTRA)}
        return (
            logged.replace(**{name: value for name, value in rows.items() if not name.startswith(_EXTRA)}),
            {**extras, **extra_rows},
        )
    return data.replace(**rows) if isinstance(data, LoggedData) else {**data, **rows}


def _n_rows(data: Any) -> int:
    return int(next(iter(_rows_of(data).values())).shape[0])


class TrainState(NamedTuple):
    """What a run carries from epoch to epoch (and from one chunk of epochs to the next).

    Attributes:
      params: current parameters.
      opt_state: the optimiser's state.
      key: PRNG key of the next epoch.
      best_loss: lowest validation loss so far (inf without validation rows).
      best_params: parameters at ``best_loss`` (returned with early stopping).
      since_best: epochs run since ``best_loss`` (int32).
    """

    params: Any
    opt_state: Any
    key: jax.Array
    best_loss: jax.Array
    best_params: Any
    since_best: jax.Array


def init_state(optimizer: optax.GradientTransformation, params: Any, key: jax.Array) -> TrainState:
    """The state before the first epoch."""
    return TrainState(params, optimizer.init(params), key, jnp.float32(jnp.inf), params, jnp.int32(0))


def train(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    params: Any,
    data: Any,
    key: jax.Array,
    *,
    epochs: int,
    batch_size: int,
    aux: Any = None,
    valid: Any = None,
    valid_loss_fn: LossFn | None = None,
    patience: int | None = None,
    metrics_fn: Callable[[Any, Any, jax.Array], dict[str, jax.Array]] | None = None,
    listener: jax.Array | None = None,
    devices: int | str | None = None,
) -> TrainResult:
    """The training run as a pure function (jit-able, vmappable over seeds).

    Args:
      loss_fn: ``(params, batch, key, aux) -> scalar``.
      optimizer: any ``optax.GradientTransformation``.
      params: initial parameters.
      data: a [`LoggedData`][opl_rank.data.LoggedData] (batches are LoggedData), a pair
        ``(LoggedData, {name: [n, ..]})`` of logged rows and per-row arrays computed once
        before training (batches are such pairs), or a dict of arrays sharing a leading
        axis ``n`` (batches are dicts).
      key: PRNG key (shuffles, step keys, validation keys).
      epochs: a Python int.
      batch_size: a Python int (capped at ``n``).
      aux: extra arrays the loss reads.
      valid: validation rows, same kind as ``data``.
      valid_loss_fn: loss on ``valid`` (default ``loss_fn``).
      patience: early stopping (needs ``valid``).
      metrics_fn: ``(params, valid, key) -> {name: scalar}`` recorded after every epoch.
      listener: an int32 token from [`listen`][listen]: its host callback receives every
        epoch's record as the run goes; results do not depend on it. A program with a host
        callback cannot be kept by the persistent compilation cache: the library's own fits
        report progress between chunks of epochs instead ([`EpochLoop`][EpochLoop]).
      devices: data parallelism (static; see [`TrainConfig`][TrainConfig]): None, a device count
        or ``"all"``. Call through [`train_jit`][train_jit], which also replicates the inputs on
        the devices.

    Returns:
      [`TrainResult`][TrainResult] with history arrays ``[epochs]``.
    """
    state, history = train_epochs(
        loss_fn,
        optimizer,
        init_state(optimizer, params, key),
        data,
        jnp.int32(0),
        epochs=epochs,
        chunk=epochs,
        batch_size=batch_size,
        aux=aux,
        valid=valid,
        valid_loss_fn=valid_loss_fn,
        patience=patience,
        metrics_fn=metrics_fn,
        listener=listener,
        devices=devices,
    )
    stopping = valid is not None and patience is not None
    return TrainResult(state.best_params if stopping else state.params, history)


def train_epochs(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    state: TrainState,
    data: Any,
    first_epoch: jax.Array,
    *,
    epochs: int,
    chunk: int,
    batch_size: int,
    aux: Any = None,
    valid: Any = None,
    valid_loss_fn: LossFn | None = None,
    patience: int | None = None,
    metrics_fn: Callable[[Any, Any, jax.Array], dict[str, jax.Array]] | None = None,
    listener: jax.Array | None = None,
    devices: int | str | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """Epochs ``first_epoch .. first_epoch + chunk - 1`` of a run of ``epochs`` (pure, jit-able).

    Epochs at or past ``epochs`` (padding of the last chunk) and epochs after early
    stopping do nothing (``active`` False). Running a run's epochs in chunks, each from the
    state the last one returned, gives the parameters and history of one scan over all
    epochs: every epoch draws its keys from the carried key, whatever the chunking.

    Args: as [`train`][train], plus ``state`` ([`init_state`][init_state] or a previous chunk's),
      ``first_epoch`` (int32 scalar, traced: one program serves every chunk) and ``chunk``
      (static: epochs per call).

    Returns:
      ``(state, history)`` with history arrays ``[chunk]``.
    """
    n_batches = _n_batches(_n_rows(data), batch_size, devices)
    stopping = valid is not None and patience is not None
    starter = EpochStart(epochs, patience if stopping else None, min(batch_size, _n_rows(data)), n_batches, devices)
    stepper = StepBlock(loss_fn, optimizer, devices)
    ender = EpochEnd((valid_loss_fn or loss_fn) if valid is not None else None, metrics_fn, stopping, n_batches)

    def epoch(state, index):  # the epoch run_loop runs as programs, here in one block of every batch
        key, k_valid, active, (rows,), (keys,) = starter.run(state.key, state.since_best, data, index)
        params, opt_state, losses, finite = stepper.run(
            state.params, state.opt_state, unpack(rows), keys, jnp.int32(n_batches), active, aux
        )
        state = state._replace(params=params, opt_state=opt_state, key=key)
        state, record = ender.run(state, (losses,), (finite,), active, k_valid, valid, aux)
        record = {name: value[0] for name, value in record.items()}  # one epoch's
        if listener is not None:
            jax.debug.callback(_notify, listener, index + 1, record, ordered=True)
        return state, record

    state, history = jax.lax.scan(epoch, TrainState(*state), first_epoch + jnp.arange(chunk, dtype=jnp.int32))
    return state, history


def _n_batches(n: int, batch_size: int, devices: int | str | None) -> int:
    """Optimiser steps per epoch on ``n`` rows (a ValueError where data parallelism cannot
    split the batch)."""
    batch = min(batch_size, n)
    mesh = data_mesh(devices)
    if mesh is not None and batch % mesh.size:
        raise ValueError(
            f"data parallel training over {mesh.size} devices needs a batch divisible by the device count: "
            f"batch_size={batch_size}{f' (capped at n={n} rows)' if batch < batch_size else ''} is not a multiple of {mesh.size}"
        )
    return n // batch


def chunk_epochs(epochs: int, n_rows: int, batch_size: int) -> int:
    """Epochs per compiled chunk: the largest divisor of ``epochs`` whose chunk has at most
    ``tuning.CHUNK_STEPS`` optimiser steps (all epochs when the run is that short; one epoch
    when a single epoch is longer). A divisor, so no chunk is padded with idle epochs (which a
    vmapped run would compute in full). The host reports progress between chunks."""
    steps_per_epoch = max(n_rows // min(batch_size, n_rows), 1)
    fits = max(tuning.CHUNK_STEPS // steps_per_epoch, 1)
    return _divisor_at_most(epochs, fits)


@dataclasses.dataclass(frozen=True)
class EpochLoop:
    """One training run's static settings, from which [`run_loop`][run_loop] builds its programs.

    Two fits whose loops have the same loss and optimiser objects share one compiled step
    program ([`steps`][EpochLoop.steps]) at every data size, in this process and -- through
    the persistent compilation cache, as no program holds a host callback -- in the next ones.

    Attributes:
      loss_fn: ``(params, batch, key, aux) -> scalar``.
      optimizer: an ``optax.GradientTransformation``.
      epochs: epochs of the run.
      chunk: epochs per compiled call ([`chunk_epochs`][chunk_epochs]).
      batch_size: rows per step (capped at ``n``).
      patience: early stopping (None: none; it needs validation rows).
      valid_loss_fn: loss on the validation rows (default ``loss_fn``).
      metrics_fn: ``(params, valid, key) -> {name: scalar}`` recorded after every epoch.
      devices: data parallelism ([`TrainConfig.devices`][TrainConfig]).
    """

    loss_fn: LossFn
    optimizer: optax.GradientTransformation
    epochs: int
    chunk: int
    batch_size: int
    patience: int | None = None
    valid_loss_fn: LossFn | None = None
    metrics_fn: Callable[[Any, Any, jax.Array], dict[str, jax.Array]] | None = None
    devices: int | str | None = None

    @classmethod
    def of(
        cls,
        loss_fn: LossFn,
        config: TrainConfig,
        n_rows: int,
        *,
        optimizer: optax.GradientTransformation | None = None,
        valid_loss_fn: LossFn | None = None,
        metrics_fn: Callable[[Any, Any, jax.Array], dict[str, jax.Array]] | None = None,
    ) -> EpochLoop:
        """The loop of ``config``'s run on ``n_rows`` rows (``optimizer``: default the config's)."""
        return cls(
            loss_fn,
            optimizer or config.make_optimizer(),
            config.epochs,
            chunk_epochs(config.epochs, n_rows, config.batch_size),
            config.batch_size,
            config.patience,
            valid_loss_fn,
            metrics_fn,
            config.devices,
        )

    def init(self, params: Any, key: jax.Array) -> TrainState:
        """The state before the first epoch (pure)."""
        return init_state(self.optimizer, params, key)

    @property
    def steps(self) -> StepBlock:
        """The run's [`StepBlock`][StepBlock]: its loss and optimiser, not ``n`` (one program at every size)."""
        return StepBlock(self.loss_fn, self.optimizer, self.devices)

    def result_params(self, state: TrainState, has_valid: bool) -> Any:
        """The run's answer: the best validation epoch's parameters with early stopping."""
        return state.best_params if has_valid and self.patience is not None else state.params


def run_loop(
    loop: EpochLoop,
    state: TrainState,
    data: Any,
    *,
    aux: Any = None,
    valid: Any = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    batched: bool = False,
) -> tuple[TrainState, dict[str, np.ndarray]]:
    """Run ``loop``'s epochs from the host, as three kinds of compiled programs.

    Each epoch is a start (shuffle and cut the rows into blocks of
    ``tuning.STEP_BLOCK`` batches: [`EpochStart`][EpochStart]), the optimiser steps block by
    block ([`StepBlock`][StepBlock]) and an end (losses, validation, early stopping:
    [`EpochEnd`][EpochEnd]). The steps' program sees one block of batches, never ``n``: one
    program serves a loss at every data size (the 70% split of `select_k`, the next cell's
    ``n``, a user's other logs), and the persistent compilation cache keeps it. The numbers
    are those of [`train_epochs`][train_epochs]'s one scan: the same keys, shuffles and steps.

    After every chunk of ``loop.chunk`` epochs the host reads the chunk's history:
    ``on_epoch(epoch, record)`` is called for every epoch that ran (per seed when
    ``batched``), and once every run has stopped early no further epoch is dispatched. The
    programs are the same with and without ``on_epoch``, so are the results, bit for bit.

    Args:
      loop: the run's [`EpochLoop`][EpochLoop].
      state: from ``loop.init`` (compiled: [`opl_rank.staging.stage`][opl_rank.staging.stage]).
      data, aux, valid: as for [`train`][train]; [`opl_rank.staging.Packed`][opl_rank.staging.Packed]
        where a seed axis is stacked.
      on_epoch: progress callback (host).
      batched: every input has a leading seed axis ``[S, ...]`` (``jax.vmap``).

    Returns:
      The final state and the history as arrays ``[epochs_run]`` (``[S, epochs_run]``).
    """
    n = leading_rows(data, batched)
    n_batches = _n_batches(n, loop.batch_size, loop.devices)
    mesh = data_mesh(loop.devices)
    if mesh is not None:
        data, aux, valid = _replicate((data, aux, valid), mesh)
    block = tuning.STEP_BLOCK
    stopping = valid is not None and loop.patience is not None
    evaluate = (loop.valid_loss_fn or loop.loss_fn) if valid is not None else None
    # Without validation or metrics nothing happens between epochs but the steps: a call spans
    # several epochs' batches (fewer calls at small n), within tuning.EPOCH_SPAN_BYTES of rows.
    row_bytes = sum(x.nbytes for x in jax.tree.leaves(data)) / max(n, 1)
    fits = tuning.EPOCH_SPAN_BYTES // max(int(row_bytes) * n_batches * min(loop.batch_size, n), 1)
    span = 1 if evaluate is not None or loop.metrics_fn is not None else _divisor_at_most(loop.chunk, fits)
    steps_per_call = span * n_batches
    counts = [np.int32(min(block, steps_per_call - first)) for first in range(0, steps_per_call, block)]
    starter = EpochStart(
        loop.epochs, loop.patience if stopping else None, min(loop.batch_size, n), block, loop.devices, span
    )
    start = _program_of(starter, batched, (3,))
    # The steps compile as a fit of this size's one program did (docs/performance.md §27-29):
    # cheaper XLA options where the fit's arrays are small, full optimisation otherwise (on CPU
    # both with tuning.CPU_COMPILE_OPTIONS).
    small_fit = small_arguments(jax.tree.leaves((state, data, aux, valid)))
    steps = _program_of(loop.steps, batched, (4,), not small_fit)
    end = _program_of(EpochEnd(evaluate, loop.metrics_fn, stopping, n_batches, span), batched, ())
    histories: list[dict[str, np.ndarray]] = []
    for first in range(0, loop.epochs, loop.chunk):
        if mesh is not None:
            state = _replicate(state, mesh)
        records = []
        with partitioner(loop.devices, _one_key(state.key, batched)):
            for index in range(first, first + loop.chunk, span):
                key, k_valid, active, blocks, keys = start(state.key, state.since_best, data, np.int32(index))
                params, opt_state = state.params, state.opt_state
                losses, finite = [], []
                for rows, block_keys, count in zip(blocks, keys, counts):
                    params, opt_state, block_losses, block_finite = steps(
                        params, opt_state, rows, block_keys, count, active, aux
                    )
                    losses.append(block_losses)
                    finite.append(block_finite)
                state = state._replace(params=params, opt_state=opt_state, key=key)
                state, record = end(state, tuple(losses), tuple(finite), active, k_valid, valid, aux)
                records.append(record)
        fetched = jax.device_get(records)
        history = {name: np.concatenate([r[name] for r in fetched], axis=-1) for name in fetched[0]}
        histories.append(history)
        if on_epoch is not None:
            _replay(on_epoch, history, first, batched)
        if not np.any(history["active"][..., -1]):
            break  # every run has stopped (or finished): the rest would do nothing
    merged = {name: np.concatenate([h[name] for h in histories], axis=-1)[..., : loop.epochs] for name in histories[0]}
    return state, merged


@dataclasses.dataclass(frozen=True)
class EpochStart:
    """The start of ``span`` epochs, as [`train_epochs`][train_epochs] begins each: their keys,
    whether each runs (``active``), and their shuffled rows one epoch after the other, cut into
    blocks of ``block`` batches (the last block padded with copies of the first batch, whose
    steps [`StepBlock`][StepBlock] skips).

    Attributes:
      epochs: epochs of the run.
      patience: early stopping (None: none).
      batch: rows per step.
      block: batches per block (``tuning.STEP_BLOCK``).
      devices: data parallelism ([`TrainConfig.devices`][TrainConfig]).
      span: epochs started at once (more than 1 only where nothing runs between epochs).
    """

    epochs: int
    patience: int | None
    batch: int
    block: int
    devices: int | str | None = None
    span: int = 1

    def run(self, key: jax.Array, since_best: jax.Array, data: Any, index: jax.Array) -> tuple:
        """``-> (key, k_valid [span], active [span], blocks, keys)``: the key carried past the
        span, each epoch's validation key and whether it runs, and per block the rows
        ``[block, batch, ..]`` (packed, as ``data``) and the step keys ``[block]``. Pure."""
        n = _n_rows(data)
        n_batches = n // self.batch
        n_keys = -(-n_batches // _KEY_BLOCK) * _KEY_BLOCK
        n_steps = self.span * n_batches
        n_blocks = -(-n_steps // self.block)

        def one_epoch(key, e):
            key, k_epoch, k_valid = jax.random.split(key, 3)
            patience = self.patience if self.patience is not None else self.epochs + 1
            active = (index + e < self.epochs) & (since_best < patience)
            k_perm, k_steps = jax.random.split(k_epoch)
            order = prng.permutation(k_perm, n)[: n_batches * self.batch].reshape(n_batches, self.batch)
            return key, (k_valid, active, order, jax.random.split(k_steps, n_keys)[:n_batches])

        key, (k_valid, active, order, step_keys) = jax.lax.scan(one_epoch, key, jnp.arange(self.span))
        order = order.reshape(n_steps, self.batch)
        step_keys = step_keys.reshape((n_steps,) + step_keys.shape[2:])
        padding = n_blocks * self.block - n_steps
        order = jnp.concatenate([order, jnp.broadcast_to(order[:1], (padding, self.batch))])
        step_keys = jnp.concatenate([step_keys, jnp.broadcast_to(step_keys[:1], (padding,) + step_keys.shape[1:])])
        rows = _rows_of(data)
        cut = _shard_rows({name: value[order] for name, value in rows.items()}, data_mesh(self.devices), 1)
        blocks = tuple(
            pack(_with_rows(data, {name: value[j * self.block : (j + 1) * self.block] for name, value in cut.items()}))
            for j in range(n_blocks)
        )
        keys = tuple(step_keys[j * self.block : (j + 1) * self.block] for j in range(n_blocks))
        return key, k_valid, active, blocks, keys


@dataclasses.dataclass(frozen=True)
class StepBlock:
    """A block of optimiser steps: the one program of a loss that sees batches and never the
    data's size ``n`` (equal losses and optimisers share it at every ``n``).

    Attributes:
      loss_fn: ``(params, batch, key, aux) -> scalar``.
      optimizer: an ``optax.GradientTransformation``.
      devices: data parallelism ([`TrainConfig.devices`][TrainConfig]).
    """

    loss_fn: LossFn
    optimizer: optax.GradientTransformation
    devices: int | str | None = None

    def run(
        self, params: Any, opt_state: Any, rows: Any, keys: jax.Array, count: jax.Array, active: jax.Array, aux: Any
    ) -> tuple[Any, Any, jax.Array, jax.Array]:
        """The first ``count`` of the block's steps when ``active`` (all of a span's epochs;
        none otherwise): ``->
        (params, opt_state, losses [block], finite [block])``, padding steps giving loss 0 and
        finite True. Pure."""
        mesh = data_mesh(self.devices)
        batches = _rows_of(rows)
        active = jnp.all(active)

        def step(carry, batch_rows, k):
            params, opt_state = carry
            batch_rows = _shard_rows(batch_rows, mesh, 0)
            loss, grads = jax.value_and_grad(self.loss_fn)(params, _with_rows(rows, batch_rows), k, aux)
            # optax mixes Python floats and int32 counts: valid under standard promotion only
            # (users and our tests may set jax_numpy_dtype_promotion="strict").
            with jax.numpy_dtype_promotion("standard"):
                updates, opt_state = self.optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            # A non-finite parameter or optimiser moment (e.g. Adam's second moment overflowing)
            # would freeze silently: record it, and the caller raises naming the step.
            finite = jnp.all(
                jnp.stack(
                    [
                        jnp.all(jnp.isfinite(x))
                        for x in jax.tree.leaves((params, opt_state))
                        if jnp.issubdtype(x.dtype, jnp.floating)
                    ]
                )
            )
            return (params, opt_state), (loss.astype(jnp.float32), finite)

        def body(carry, inputs):
            i, batch_rows, k = inputs
            idle = (jnp.float32(0.0), jnp.bool_(True))

            def run(c):  # an inactive run's step does nothing (a select where runs are vmapped)
                return jax.lax.cond(active, lambda c: step(c, batch_rows, k), lambda c: (c, idle), c)

            return jax.lax.cond(i < count, run, lambda c: (c, idle), carry)  # padding: skipped

        block = keys.shape[0]
        (params, opt_state), (losses, finite) = jax.lax.scan(
            body, (params, opt_state), (jnp.arange(block), batches, keys)
        )
        return params, opt_state, losses, finite


@dataclasses.dataclass(frozen=True)
class EpochEnd:
    """The end of ``span`` epochs, as [`train_epochs`][train_epochs] ends each: its mean loss,
    first non-finite step, validation loss and early-stopping state, and its history record.

    Attributes:
      valid_loss_fn: loss on the validation rows (None: no validation rows).
      metrics_fn: ``(params, valid, key) -> {name: scalar}`` recorded after every epoch.
      stopping: early stopping on (validation rows and a patience).
      n_batches: steps of an epoch.
      span: epochs ended at once (1 with validation rows or metrics, which need each epoch's
        parameters).
    """

    valid_loss_fn: LossFn | None
    metrics_fn: Callable[[Any, Any, jax.Array], dict[str, jax.Array]] | None
    stopping: bool
    n_batches: int
    span: int = 1

    def run(
        self,
        state: TrainState,
        losses: tuple,
        finite: tuple,
        active: jax.Array,
        k_valid: jax.Array,
        valid: Any,
        aux: Any,
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """``state`` after the span's steps -> ``(state, record)``, the record's entries
        ``[span]``. Pure."""
        if self.span > 1 and (self.valid_loss_fn is not None or self.metrics_fn is not None):
            raise ValueError("EpochEnd: a span of several epochs has no per-epoch parameters to validate")
        n_steps = self.span * self.n_batches
        losses_all = jnp.concatenate(losses)[:n_steps].reshape(self.span, self.n_batches)
        finite_all = jnp.concatenate(finite)[:n_steps].reshape(self.span, self.n_batches)
        if self.span == 1:  # the one scan's sum over one epoch's losses, bit for bit
            mean_loss = (jnp.sum(losses_all[0]) / self.n_batches)[None]
        else:
            mean_loss = jnp.sum(losses_all, axis=1) / self.n_batches
        train_loss = jnp.where(active, mean_loss, jnp.float32(jnp.nan))
        first_bad = jnp.where(jnp.all(finite_all, axis=1), -1, jnp.argmin(finite_all, axis=1)).astype(jnp.int32)
        record = {"train_loss": train_loss, "active": active, "nonfinite_step": jnp.where(active, first_bad, -1)}
        params, best_loss, best_params, since_best = state.params, state.best_loss, state.best_params, state.since_best
        if self.valid_loss_fn is not None:
            valid_loss = self.valid_loss_fn(params, valid, k_valid[0], aux)
            record["valid_loss"] = jnp.where(active, valid_loss, jnp.nan)
            better = active[0] & (valid_loss < best_loss)
            best_loss = jnp.where(better, valid_loss, best_loss)
            best_params = jax.tree.map(lambda new, old: jnp.where(better, new, old), params, best_params)
            since_best = jnp.where(better, 0, since_best + active[0].astype(jnp.int32))
        if self.metrics_fn is not None:
            record.update({name: v[None] for name, v in self.metrics_fn(params, valid, k_valid[0]).items()})
        return state._replace(best_loss=best_loss, best_params=best_params, since_best=since_best), record


def _divisor_at_most(count: int, limit: int) -> int:
    """The largest divisor of ``count`` that is at most ``limit`` (at least 1)."""
    return max(d for d in range(1, max(min(count, limit), 1) + 1) if count % d == 0)


# Keyed by the part's value (a bound method compares its instance by identity): equal parts
# built by separate fits share one jitted function, hence one compilation.
@functools.lru_cache(maxsize=1024)
def _program_of(
    part: EpochStart | StepBlock | EpochEnd, batched: bool, shared: tuple[int, ...], hot: bool = False
) -> Callable[..., Any]:
    return stage(part.run, batched, shared, hot)


@functools.lru_cache(maxsize=256)
def _init_program(loop: EpochLoop) -> Callable[..., Any]:
    return stage(loop.init, False)


def _one_key(key: jax.Array, batched: bool) -> jax.Array:
    return key[0] if batched else key


def _replay(
    on_epoch: Callable[[int, dict[str, float]], None], history: dict[str, np.ndarray], first: int, batched: bool
) -> None:
    """``on_epoch`` for every epoch of a chunk's history that ran (with seeds: epoch by epoch,
    every seed's in turn, as a vmapped run reached them)."""
    runs = (
        [history] if not batched else [{n: v[s] for n, v in history.items()} for s in range(history["active"].shape[0])]
    )
    for e in range(history["active"].shape[-1]):
        for run in runs:
            if run["active"][e]:
                on_epoch(first + e + 1, _reported(run, e))


def _reported(history: dict[str, Any], epoch: int | None = None) -> dict[str, float]:
    """An epoch's record as progress reports it: floats, without the loop's bookkeeping."""
    return {
        name: float(v if epoch is None else v[epoch])
        for name, v in history.items()
        if name not in ("active", "nonfinite_step")
    }


# Host callbacks of running fits, by token: a dispatch table for progress and timing only
# (what a run computes never depends on it).
_LISTENERS: dict[int, Callable[[int, dict[str, float]], None]] = {}


def _notify(token: Any, epoch: Any, record: dict[str, Any]) -> None:
    callback = _LISTENERS.get(int(token))
    if callback is not None and bool(record["active"]):
        callback(int(epoch), _reported(record))


@contextlib.contextmanager
def listen(callback: Callable[[int, dict[str, float]], None]) -> Iterator[jax.Array]:
    """``with listen(fn) as token: train(..., listener=token)``: ``fn(epoch, record)`` runs
    on the host after every epoch of that run, from a host callback inside the program (which
    the persistent compilation cache then cannot keep; the library's fits use
    [`run_loop`][run_loop] instead)."""
    token = max(_LISTENERS, default=0) + 1
    _LISTENERS[token] = callback
    try:
        yield jnp.int32(token)
    finally:
        del _LISTENERS[token]


def print_epoch(epochs: int) -> Callable[[int, dict[str, float]], None]:
    """An ``on_epoch`` that prints one line per epoch to stderr."""

    def show(epoch: int, record: dict[str, float]) -> None:
        extra = "".join(f"  {name} {v:+.5f}" for name, v in record.items() if name != "train_loss")
        print(f"epoch {epoch:>3}/{epochs}  train_loss {record['train_loss']:+.5f}{extra}", file=sys.stderr)

    return show


_STATIC = ("loss_fn", "optimizer", "epochs", "batch_size", "valid_loss_fn", "patience", "metrics_fn", "devices")
_train_compiled = jax.jit(train, static_argnames=_STATIC)

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _WithLower(Generic[_P, _R]):
    """A function that also offers a jitted function's ``lower`` (what ``train_jit.lower`` is):
    calls go to the function, whose name, docstring and signature it carries."""

    def __init__(self, fn: Callable[_P, _R], lower: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self.lower = lower

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self._fn(*args, **kwargs)

    def __reduce__(self) -> str:
        return self._fn.__qualname__  # pickled by reference, as the module-level function it stands for


def _with_lower(lower: Callable[..., Any]) -> Callable[[Callable[_P, _R]], _WithLower[_P, _R]]:
    """Decorator: the function with ``lower`` attached (see [`_WithLower`][_WithLower])."""
    return lambda fn: _WithLower(fn, lower)


@_with_lower(_train_compiled.lower)
def train_jit(
    loss_fn: LossFn, optimizer: optax.GradientTransformation, params: Any, data: Any, key: jax.Array, **options: Any
) -> TrainResult:
    """[`train`][train], jit-compiled (static: the functions, the optimiser and the ints).

    With ``devices`` set the concrete inputs are first replicated on the mesh's devices
    (arrays committed to one device could not meet a computation over several).
    ``train_jit.lower`` lowers without placing anything.
    """
    devices = options.get("devices")
    if devices is None:
        return _train_compiled(loss_fn, optimizer, params, data, key, **options)
    mesh = data_mesh(devices)
    assert mesh is not None  # devices is set
    params, data, key = _replicate((params, data, key), mesh)
    options.update(
        {
            name: _replicate(options[name], mesh)
            for name in ("aux", "valid", "listener")
            if options.get(name) is not None
        }
    )
    with partitioner(devices, key):
        return _train_compiled(loss_fn, optimizer, params, data, key, **options)


def partitioner(devices: int | str | None, key: jax.Array) -> contextlib.AbstractContextManager:
    """The partitioner context of programs fed by a data-parallel run's (replicated) arrays:
    none without ``devices``; see [`_partitioner_for`][_partitioner_for]."""
    return contextlib.nullcontext() if devices is None else _partitioner_for(key)


def _partitioner_for(key: jax.Array) -> contextlib.AbstractContextManager:
    """JAX 0.10's Shardy partitioner cannot compile philox keys' ``mulhi`` over several
    devices ("Unable to convert MHLO to StableHLO"); such runs use the GSPMD partitioner
    (same partitioned program, same numbers). Other keys use JAX's default."""
    try:
        philox = "philox" in str(jax.random.key_impl(key))
    except (TypeError, ValueError):  # a raw uint32 key: threefry
        philox = False
    # jax.config creates one attribute per option at runtime; its type declares none of them
    if not philox or not jax.config.jax_use_shardy_partitioner:  # type: ignore[attr-defined]
        return contextlib.nullcontext()
    from jax._src import config as jax_config  # the flag's context manager (no public one)

    return jax_config.use_shardy_partitioner(False)


def history_records(history: dict[str, Any]) -> list[dict[str, float]]:
    """``{name: [epochs]}`` arrays (one run) -> one dict per epoch that ran."""
    arrays = {name: np.asarray(value) for name, value in history.items()}
    records: list[dict[str, float]] = []
    for e in range(arrays["active"].shape[0]):
        if not arrays["active"][e]:
            break
        records.append(
            {
                "epoch": e + 1,
                **_reported(arrays, e),
            }
        )
    return records


def check_finite(history: dict[str, Any], what: str) -> None:
    """A FloatingPointError naming ``what``, the epoch and the step if a training loss, a
    parameter or an optimiser moment became non-finite (never a silently frozen fit)."""
    losses = np.asarray(history["train_loss"])
    active = np.asarray(history["active"])
    steps = np.asarray(history["nonfinite_step"])
    epochs = np.nonzero(active & ((steps >= 0) | ~np.isfinite(losses)))[0]
    if epochs.size:
        e = int(epochs[0])
        where = f"epoch {e + 1}" + (f", step {int(steps[e]) + 1} of the epoch" if steps[e] >= 0 else "")
        raise FloatingPointError(
            f"{what}: a training loss, parameter or optimiser state became non-finite at {where} "
            f"(epoch loss {losses[e]}); lower the learning rate, check rewards and propensities, or clip weights"
        )


def minimize(
    loss_fn: LossFn,
    params: Any,
    data: Any,
    key: jax.Array,
    config: TrainConfig,
    *,
    optimizer: optax.GradientTransformation | None = None,
    aux: Any = None,
    valid: Any = None,
    valid_loss_fn: LossFn | None = None,
    metrics_fn: Callable[[Any, Any, jax.Array], dict[str, jax.Array]] | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    name: str = "training",
) -> TrainResult:
    """Minimise ``mean over batches of loss_fn(params, batch, key, aux)``.

    Args:
      loss_fn: ``(params, batch, key, aux) -> scalar``; jit-able. Pass the same function
        object across fits to reuse its compilation.
      params: initial parameters (any pytree).
      data: training rows: a [`LoggedData`][LoggedData] or a dict of arrays sharing a leading
        axis ``n`` (e.g. pairs of rounds, or queries).
      key: PRNG key (shuffles and the loss's own sampling).
      config: [`TrainConfig`][TrainConfig].
      optimizer: an ``optax.GradientTransformation`` (default: ``config.make_optimizer()``;
        reuse one object across fits to reuse its compilation).
      aux: extra arrays the loss reads (e.g. a fitted reward model's parameters).
      valid: optional validation rows (monitoring; early stopping with ``config.patience``).
      valid_loss_fn: loss on ``valid`` (default ``loss_fn``).
      metrics_fn: ``(params, valid, key) -> {name: scalar}`` recorded after every epoch.
      on_epoch: ``(epoch, record)`` called on the host for every epoch that ran, after each
        compiled chunk of epochs ([`run_loop`][run_loop]; ``config.progress`` prints instead).
      name: what is trained, for error messages.

    Returns:
      [`TrainResult`][TrainResult] with the final (or, with early stopping, best) parameters and
      one history dict per epoch that ran.
    """
    if on_epoch is None and config.progress:
        on_epoch = print_epoch(config.epochs)
    loop = EpochLoop.of(
        loss_fn, config, _n_rows(data), optimizer=optimizer, valid_loss_fn=valid_loss_fn, metrics_fn=metrics_fn
    )
    state = _init_program(loop)(params, key)
    state, history = run_loop(loop, state, data, aux=aux, valid=valid, on_epoch=on_epoch)
    check_finite(history, name)
    return TrainResult(loop.result_params(state, valid is not None), history_records(history))
