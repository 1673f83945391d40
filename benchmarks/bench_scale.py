"""Scaling: simulation and per-epoch fit time of every learner, and peak memory, by size.

Usage (from the repository root)::

    python benchmarks/bench_scale.py --sizes small          # (D, L, n) = (10, 5, 1e4): minutes on 2 CPUs
    python benchmarks/bench_scale.py --sizes all --device   # the one command for a GPU machine
    python benchmarks/bench_scale.py --quick --methods ips,rpod1   # smoke test (seconds)
    python benchmarks/bench_scale.py --sizes medium --max-n 2000    # check a size works, tiny n
    python benchmarks/bench_scale.py --sizes medium --n-samples 2  # fewer sampled rankings per row
    python benchmarks/bench_scale.py --sizes medium --methods ips,iips --slot-marginals insertion

Sizes (D items, L slots, n logged rows):

  small   (10, 5, 1e4)
  medium  (100, 10, 1e5)
  large   (1000, 10, 1e5), and (1000, 10, 1e6) for ips, rips and rpod1 only
  all     every one of them

Methods: every learner of ``opl_rank.opl.learners.learning_methods()`` with its default
(additive) reward model -- dm, ips, snips, dr, iips, rips, regression -- and R-POD as
rpod1, rpod2, rpod3 (k = 1..3). The environment is ``SyntheticRankingEnv`` with its
defaults (dx = 5, lambda = 0.5, PL-linear logging policy, DCG weights); IIPS's data carry
exact logged position marginals (the learner itself uses sampled ones from D = 16 at L = 10,
chosen by cost). Measured tables: docs/performance.md section 12 (``--timeout`` bounds each
configuration).

Every (size, method) runs in its own subprocess, so that its peak resident memory
(``getrusage`` ``ru_maxrss``; on an accelerator also the device's ``peak_bytes_in_use``) is
its own. In it: the data are simulated twice ("cold" compiles, "warm" is reported); fits
with 1 and with E+1 epochs (policy and reward model alike) each run cold and then warm on
another key, and

  epoch_s   = (warm fit with E+1 epochs - warm fit with 1 epoch) / E

i.e. one pass over the n rows of every stage the method trains (policy, f_hat or both),
without compilation or fixed costs; ``compile_s`` = cold - warm fit with 1 epoch.

For IPS the run also reports the flops of one training row (XLA's ``cost_analysis`` of a
one-batch epoch, divided by the batch; and the analytic count of the linear scorer's
matrix products alone), the achieved GFLOP/s at the measured epoch time and its fraction
of this machine's float32 matmul rate (a large ``jnp.dot`` timed in the same run), and a
naive baseline: the same IPS gradient written as a per-row Python/NumPy loop with a NumPy
Adam step, timed on a 1000-row slice and extrapolated to an epoch (its gradient is checked
against the library's on one batch). obp has no ranking-policy learner to compare with.

``--device`` trains with ``TrainConfig(devices="all")``: every minibatch split over all
visible devices (data parallel; the batch size must be divisible by their number).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script
sys.path.insert(0, str(Path(__file__).resolve().parent))

SIZES = {
    "small": [(10, 5, 10_000, None)],
    "medium": [(100, 10, 100_000, None)],
    "large": [(1000, 10, 100_000, None), (1000, 10, 1_000_000, ("ips", "rips", "rpod1"))],
}
QUICK_SIZES = [(6, 3, 2_000, None)]
METHODS = ("dm", "ips", "snips", "dr", "iips", "rips", "regression", "rpod1", "rpod2", "rpod3")


def _learner(method: str, epochs: int, batch_size: int, devices, n_samples: int = 8, slot_marginals: str = "auto"):
    from opl_rank.opl.learners import LearnerConfig
    from opl_rank.optimization import TrainConfig

    k = int(method[4:]) if method.startswith("rpod") else None
    return LearnerConfig(
        "rpod" if k is not None else method,
        k=k,
        n_samples=n_samples,
        slot_marginals=slot_marginals,
        train=TrainConfig(epochs=epochs, batch_size=batch_size, learning_rate=0.05, devices=devices),
        reward_train=TrainConfig(epochs=epochs, batch_size=batch_size, learning_rate=0.02, devices=devices),
    )


def _ready(policy) -> None:
    """Wait until every fitted parameter array of the policy is computed."""
    import jax

    parts = [policy, getattr(policy, "first_stage", None), getattr(policy, "reward_model", None)]
    params = [p.params for p in parts if p is not None and hasattr(p, "params")]
    jax.block_until_ready([x for x in jax.tree.leaves(params) if isinstance(x, jax.Array)])


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- one configuration (the child process) ------------------------------------------------
def run_one(spec: dict) -> dict:
    import jax

    from opl_rank import make_key
    from opl_rank.opl.learners import fit
    from simulators import SyntheticRankingEnv

    D, L, n, method, epochs = spec["D"], spec["L"], spec["n"], spec["method"], spec["epochs"]
    devices = "all" if spec["device"] else None
    env = SyntheticRankingEnv.create(make_key(0), n_items=D, ranking_length=L)
    marginals = "exact" if method == "iips" else "none"
    simulate = lambda seed: jax.block_until_ready(
        env.sample_logged_data(make_key(seed), n, position_marginals=marginals)
    )
    sim_cold = _seconds(lambda: simulate(1))
    start = time.perf_counter()
    data = simulate(2)
    sim_warm = time.perf_counter() - start
    out = {
        "D": D,
        "L": L,
        "n": n,
        "method": method,
        "position_marginals": marginals,
        "simulate_s": sim_warm,
        "simulate_compile_s": max(sim_cold - sim_warm, 0.0),
    }

    one, more = (
        _learner(method, e, spec["batch_size"], devices, spec.get("n_samples", 8), spec.get("slot_marginals", "auto"))
        for e in (1, epochs + 1)
    )
    repeats = range(spec["repeats"])
    cold_1 = _seconds(lambda: _ready(fit(data, make_key(3), one)))
    warm_1 = min(_seconds(lambda: _ready(fit(data, make_key(4 + r), one))) for r in repeats)
    _ready(fit(data, make_key(3), more))
    warm_more = min(_seconds(lambda: _ready(fit(data, make_key(4 + r), more))) for r in repeats)
    epoch = (warm_more - warm_1) / epochs
    if epoch <= 0:  # below the timing noise (tiny n): no per-epoch figure
        epoch = None
    out.update(
        compile_s=max(cold_1 - warm_1, 0.0),
        fit_1_epoch_s=warm_1,
        fit_more_epochs_s=warm_more,
        epoch_s=epoch,
        rows_per_s=None if epoch is None else n / epoch,
    )
    if method == "ips":
        out.update(ips_flops(data, spec["batch_size"]))
        out.update(naive_ips(data, spec["batch_size"], spec["naive_rows"]))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        out["device_peak_mb"] = stats["peak_bytes_in_use"] / 2**20
    out["devices"] = jax.device_count() if devices else 1
    return out


def ips_flops(data, batch_size: int) -> dict:
    """Flops of one IPS training row: XLA's count for one training step (loss, gradient,
    Adam update) on a batch, divided by the batch (one device's program)."""
    import jax
    import optax

    from opl_rank import make_key
    from opl_rank.opl.learners import _plan, _surrogate

    batch = min(batch_size, data.n_rounds)
    part = data.take(slice(0, batch))
    plan = _plan(part, _learner("ips", 1, batch, None))
    loss = _surrogate(plan)
    optimizer = optax.adam(0.05)
    params = plan.policy_module.init(make_key(0), part.context[:1])

    def step(params, state, rows, key):
        _, grads = jax.value_and_grad(loss)(params, part.replace(**rows), key, None)  # tracers: not revalidated
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    compiled = jax.jit(step).lower(params, optimizer.init(params), part.row_fields(), make_key(1)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    dx, D = part.context.shape[1], data.n_items
    return {
        "ips_flops_per_row": float(cost.get("flops", float("nan"))) / batch,
        "ips_bytes_per_row": float(cost.get("bytes accessed", float("nan"))) / batch,
        # logits x W + b ([dx] x [dx, D]) forward, and the kernel's gradient x^T g backward
        "ips_matmul_flops_per_row": 4.0 * dx * D,
    }


def naive_ips(data, batch_size: int, rows: int) -> dict:
    """IPS epoch as a per-row Python loop (NumPy gradient of the linear PL policy, NumPy Adam),
    timed on ``rows`` rows and extrapolated to ``n``; its gradient is checked on one batch."""
    import jax
    import numpy as np

    from opl_rank import make_key
    from opl_rank.opl.learners import _plan, _surrogate

    context = np.asarray(data.context, np.float64)
    ranking = np.asarray(data.ranking)
    value = np.asarray(data.reward, np.float64) @ np.asarray(data.position_weight, np.float64)
    log_pi0 = np.asarray(data.log_pi0_prefix[:, -1], np.float64)
    D = data.n_items

    def row_gradient(W, b, i):
        """d/d(W, b) of -(w R) for row i: -w R grad log pi(a | x) (w without gradient)."""
        s = context[i] @ W + b
        remaining = np.ones(D, bool)
        log_pi, g = 0.0, np.zeros(D)
        for item in ranking[i]:
            z = s[remaining]
            top = z.max()
            lse = top + np.log(np.exp(z - top).sum())
            log_pi += s[item] - lse
            soft = np.zeros(D)
            soft[remaining] = np.exp(z - lse)
            g[item] += 1.0
            g -= soft
            remaining[item] = False
        scale = -np.exp(min(log_pi - log_pi0[i], 50.0)) * value[i]
        return np.outer(context[i], scale * g), scale * g

    def naive_epoch(rows_to_do, W, b):
        m = [np.zeros_like(W), np.zeros_like(b)]
        v = [np.zeros_like(W), np.zeros_like(b)]
        t = 0
        for start in range(0, rows_to_do - batch_size + 1, batch_size):
            gW, gb = np.zeros_like(W), np.zeros_like(b)
            for i in range(start, start + batch_size):
                dW, db = row_gradient(W, b, i)
                gW += dW
                gb += db
            t += 1
            for j, (p, gr) in enumerate(((W, gW / batch_size), (b, gb / batch_size))):
                m[j] = 0.9 * m[j] + 0.1 * gr
                v[j] = 0.999 * v[j] + 0.001 * gr**2
                p -= 0.05 * (m[j] / (1 - 0.9**t)) / (np.sqrt(v[j] / (1 - 0.999**t)) + 1e-8)
        return W, b

    # the baseline computes the library's gradient (one batch, the scorer's initial parameters)
    batch = min(batch_size, data.n_rounds)
    part = data.take(slice(0, batch))
    plan = _plan(part, _learner("ips", 1, batch, None))
    params = plan.policy_module.init(make_key(0), part.context[:1])
    ours = jax.grad(_surrogate(plan))(params, part, make_key(1), None)["params"]["Dense_0"]
    W0 = np.asarray(params["params"]["Dense_0"]["kernel"], np.float64)
    b0 = np.asarray(params["params"]["Dense_0"]["bias"], np.float64)
    grads = [row_gradient(W0, b0, i) for i in range(batch)]
    gW = sum(g[0] for g in grads) / batch
    scale = max(float(np.abs(gW).max()), 1e-12)
    diff = float(np.abs(gW - np.asarray(ours["kernel"], np.float64)).max()) / scale

    rows = max(batch_size, min(rows, data.n_rounds) // batch_size * batch_size)
    spent = _seconds(lambda: naive_epoch(rows, W0.copy(), b0.copy()))
    return {"naive_rows_timed": rows, "naive_epoch_s": spent / rows * data.n_rounds, "naive_grad_rel_diff": diff}


# -- the parent: sizes x methods, one subprocess each --------------------------------------
def matmul_gflops(size: int, repeats: int = 3) -> float:
    """This machine's float32 matmul rate (one device, default precision)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = min(_seconds(lambda: dot(a, b).block_until_ready()) for _ in range(repeats))
    return 2.0 * size**3 / best / 1e9


def run_child(spec: dict, timeout: float) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**{k: spec[k] for k in ("D", "L", "n", "method")}, "error": f"timeout after {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {**{k: spec[k] for k in ("D", "L", "n", "method")}, "error": proc.stderr.strip()[-800:]}
    return json.loads(lines[-1])


def main() -> None:
    from opl_rank.opl.learners import SLOT_MARGINALS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small", choices=[*SIZES, "all"])
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {list(METHODS)}")
    parser.add_argument("--epochs", type=int, default=2, help="E: per-epoch time from fits with 1 and E+1 epochs")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--n-samples", type=int, default=8, help="LearnerConfig.n_samples (sampled rankings per row)")
    parser.add_argument(
        "--slot-marginals",
        default="auto",
        choices=SLOT_MARGINALS,
        help="LearnerConfig.slot_marginals (how IIPS gets the policy's slot marginals)",
    )
    parser.add_argument("--quick", action="store_true", help="one tiny size (D=6, L=3, n=2000): a smoke test")
    parser.add_argument("--device", action="store_true", help="data parallel over every visible device (GPU/TPU)")
    parser.add_argument("--max-n", type=int, default=None, help="cap every size's n (to check a size runs)")
    parser.add_argument("--repeats", type=int, default=2, help="warm fits per epoch count (the fastest is kept)")
    parser.add_argument("--naive-rows", type=int, default=1000, help="rows of the naive IPS loop, extrapolated")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per (size, method) subprocess")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_one(json.loads(args.child))))
        return

    import jax
    from _timing import environment

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    sizes = (
        QUICK_SIZES
        if args.quick
        else [s for name in (SIZES if args.sizes == "all" else [args.sizes]) for s in SIZES[name]]
    )
    devices = jax.device_count() if args.device else 1
    if args.batch_size % devices:
        parser.error(f"--batch-size {args.batch_size} must be divisible by the {devices} devices")
    start = time.perf_counter()
    gflops = matmul_gflops(512 if args.quick else (8192 if jax.default_backend() != "cpu" else 2048))
    print(
        f"float32 matmul: {gflops:.1f} GFLOP/s per device ({jax.default_backend()}, {devices} device(s) used)",
        flush=True,
    )
    results = []
    for D, L, n, only in sizes:
        n = min(n, args.max_n) if args.max_n else n
        for method in methods:
            if only is not None and method not in only:
                continue
            spec = {
                "D": D,
                "L": L,
                "n": n,
                "method": method,
                "epochs": 1 if args.quick else args.epochs,
                "batch_size": args.batch_size,
                "n_samples": args.n_samples,
                "slot_marginals": args.slot_marginals,
                "device": args.device,
                "repeats": max(args.repeats, 1),
                "naive_rows": min(args.naive_rows, 256 if args.quick else args.naive_rows),
            }
            row = run_child(spec, args.timeout)
            if "ips_flops_per_row" in row and row["rows_per_s"] is not None:
                achieved = row["ips_flops_per_row"] * row["rows_per_s"] / 1e9
                row.update(
                    ips_gflops=achieved,
                    ips_fraction_of_matmul=achieved / (gflops * devices),
                    ratio_naive_over_ours=row["naive_epoch_s"] / row["epoch_s"],
                )
            results.append(row)
            if "error" in row:
                print(f"  D={D:<5} L={L:<3} n={n:<8} {method:<11} ERROR {row['error'][-300:]}", flush=True)
                continue
            epoch = (
                "(below timing noise)"
                if row["epoch_s"] is None
                else f"{row['epoch_s']:8.4f} s ({row['rows_per_s']:>10,.0f} rows/s)"
            )
            line = (
                f"  D={D:<5} L={L:<3} n={n:<8} {method:<11} simulate {row['simulate_s']:8.3f} s  "
                f"compile {row['compile_s']:6.2f} s  epoch {epoch}  peak RSS {row['peak_rss_mb']:7.0f} MB"
            )
            if "device_peak_mb" in row:
                line += f"  device peak {row['device_peak_mb']:.0f} MB"
            if "ips_gflops" in row:
                line += (
                    f"\n      IPS: {row['ips_flops_per_row']:,.0f} flops/row (matmuls {row['ips_matmul_flops_per_row']:,.0f}), "
                    f"{row['ips_gflops']:.3f} GFLOP/s = {row['ips_fraction_of_matmul']:.2%} of matmul; "
                    f"naive per-row loop {row['naive_epoch_s']:.2f} s/epoch = {row['ratio_naive_over_ours']:.0f}x ours "
                    f"(gradient rel. diff {row['naive_grad_rel_diff']:.1e})"
                )
            print(line, flush=True)
    summary = {
        "bench": "scale",
        "quick": args.quick,
        "sizes": "quick" if args.quick else args.sizes,
        "methods": methods,
        "epochs": 1 if args.quick else args.epochs,
        "batch_size": args.batch_size,
        "n_samples": args.n_samples,
        "slot_marginals": args.slot_marginals,
        "device": args.device,
        "devices": devices,
        "matmul_gflops": round(gflops, 2),
        "results": results,
        "total_seconds": round(time.perf_counter() - start, 1),
        **environment(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
