"""The main job as a new user meets it: wall time with an empty and a filled compilation cache.

Usage (from the repository root)::

    python benchmarks/bench_main_job.py                      # small preset, quickstart, one D=100 cell
    python benchmarks/bench_main_job.py --scenarios small    # one of them
    python benchmarks/bench_main_job.py --device             # on the accelerator (GPU), same scenarios

Every scenario runs in fresh processes, twice: first with an empty persistent compilation
cache (a temporary ``OPL_RANK_JAX_CACHE``), then again with the cache that run filled.

Scenarios:
  small       ``opl-rank sweep --config experiments/configs/synthetic_opl_small.yaml`` (4 cells)
  quickstart  the README's Quickstart code block, executed as written
  d100        one cell of ``synthetic_opl_d100.yaml`` (lambda 0.5, n 10,000, seed 0)

For each run: the wall time of the process's work (imports included), JAX's compile time
(tracing, lowering to MLIR, XLA's backend compile or the persistent cache's retrieval) from
``jax.monitoring``, the persistent cache's hits and misses, and for the sweeps that time split
per sweep step (ground truth, logging, each method): wall and compile seconds, summed over
the cells (with cells in threads, the default on 2 or more cores, each thread's steps are
timed on their own, so the steps add up to more than the wall time). The programs that took
longest to compile are listed by name. ``--backend`` passes a sweep backend (default: the
command line's own default).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import environment  # noqa: E402

SCENARIOS = ("small", "quickstart", "d100")
COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "backend_compile_s",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_retrieval_s",
}
# JAX times the persistent cache's look-up and read inside the backend compile event (both run in
# `compiler.compile_or_get_cached`): cache_retrieval_s is a part of backend_compile_s, reported
# on its own and not added again to compile_s (until 2026-12-08 it was, counted twice).


def quickstart_code() -> str:
    """The README's first ``python`` block after the "## Quickstart" heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    if match is None:
        raise SystemExit("README.md: no python block under '## Quickstart'")
    return match.group(1)


def sweep_argv(scenario: str, out_dir: str, backend: str | None = None) -> list[str]:
    chosen = ["--backend", backend] if backend else []
    if scenario == "small":
        return [
            "sweep",
            "--config",
            "experiments/configs/synthetic_opl_small.yaml",
            "--set",
            f"output_dir={out_dir}",
        ] + chosen
    return chosen + [
        "sweep",
        "--config",
        "experiments/configs/synthetic_opl_d100.yaml",
        "--set",
        "lam=0.5",
        "--set",
        "n=10000",
        "--set",
        "seeds=0",
        "--set",
        f"output_dir={out_dir}",
    ]


def child(scenario: str, out_dir: str, backend: str | None = None) -> dict[str, Any]:
    """One run in this (fresh) process; JAX's compile events counted from the first import."""
    start = time.perf_counter()
    import jax

    totals: dict[str, float] = collections.defaultdict(float)
    per_step: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    per_program: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    # each thread's current step: (name, since); compile events come on the compiling thread
    current: dict[int, tuple[str, float]] = {threading.get_ident(): ("setup", time.perf_counter())}
    lock = threading.Lock()

    def on_duration(event: str, duration: float, **kwargs: Any) -> None:
        name = COMPILE_EVENTS.get(event)
        if name is None:
            return
        with lock:
            totals[name] += duration
            if name != "cache_retrieval_s":  # a part of backend_compile_s (see COMPILE_EVENTS)
                per_step[current.get(threading.get_ident(), ("setup", 0.0))[0]]["compile_s"] += duration
            if name in ("backend_compile_s", "lower_s"):
                per_program[str(kwargs.get("fun_name", "?"))] += duration

    def on_event(event: str, **kwargs: Any) -> None:
        with lock:
            if event.endswith("cache_hits"):
                counts["cache_hits"] += 1
            elif event.endswith("compile_requests_use_cache"):
                counts["compile_requests"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)

    def enter(label: str | None) -> None:
        """This thread starts step ``label`` (None: its cell group is done)."""
        now, me = time.perf_counter(), threading.get_ident()
        with lock:
            if me in current:
                step, since = current.pop(me)
                per_step[step]["wall_s"] += now - since
            if label is not None:
                current[me] = (re.split(r"[(/]", label)[0], now)

    if scenario == "quickstart":
        code = quickstart_code()
        enter("quickstart")
        exec(compile(code, "README.md:Quickstart", "exec"), {"__name__": "__quickstart__"})
    else:
        from experiments import cli, progress

        def observe(label: str | None) -> None:
            """A cell group's step starts on this thread (None: the group is done; the main
            thread goes on with the sweep's own work: cell files, tables, plots)."""
            if label is None:
                label = "main thread outside cells" if threading.current_thread() is threading.main_thread() else None
            enter(label)

        # an observer, not a wrapper of the sweep's functions: wrapping one turns the program cache off
        progress.STEP_OBSERVERS.append(observe)
        enter("main thread outside cells")
        code = cli.main(sweep_argv(scenario, out_dir, backend))  # with progress, as a user runs it
        if code not in (0, None):
            raise SystemExit(f"sweep exited with {code}")
    enter("done")
    wall = time.perf_counter() - start
    compile_s = totals["trace_s"] + totals["lower_s"] + totals["backend_compile_s"]
    counts["cache_misses"] = counts["compile_requests"] - counts["cache_hits"]
    top = sorted(per_program.items(), key=lambda item: -item[1])[:8]
    steps = {name: {k: round(v, 2) for k, v in d.items()} for name, d in per_step.items() if name != "done"}
    return {
        "wall_s": round(wall, 2),
        "compile_s": round(compile_s, 2),
        **{k: round(v, 2) for k, v in totals.items()},
        **counts,
        "steps": steps,
        "slowest_programs": [[name, round(s, 2)] for name, s in top],
    }


def run(scenario: str, cache_dir: str, device: bool, backend: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out_dir:
        env = {**os.environ, "OPL_RANK_JAX_CACHE": cache_dir}
        if not device:
            env["JAX_PLATFORMS"] = "cpu"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", scenario, "--out-dir", out_dir]
            + (["--backend", backend] if backend else []),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    if proc.returncode:
        raise SystemExit(f"{scenario} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {SCENARIOS}")
    parser.add_argument("--device", action="store_true", help="run on JAX's default backend (the GPU) instead of CPU")
    parser.add_argument(
        "--backend",
        choices=("auto", "serial", "threads", "processes"),
        help="the sweeps' --backend (default: the command line's default)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, str(ROOT))
        os.chdir(ROOT)
        result = child(args.child, args.out_dir, args.backend)
        print(json.dumps(result))
        return result
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {SCENARIOS}")
    out: dict[str, Any] = {"bench": "main_job", "device": args.device, "backend": args.backend, **environment()}
    for scenario in scenarios:
        with tempfile.TemporaryDirectory() as cache_dir:
            for state in ("cold", "warm"):
                result = run(scenario, cache_dir, args.device, args.backend)
                out[f"{scenario}_{state}"] = result
                print(
                    f"{scenario:10s} {state}: {result['wall_s']:6.1f} s wall, {result['compile_s']:5.1f} s compiling "
                    f"({result.get('cache_hits', 0)} cache hits, {result.get('cache_misses', 0)} misses)",
                    flush=True,
                )
                for step, split in result["steps"].items():
                    print(
                        f"    {step:28s} {split.get('wall_s', 0):6.2f} s  ({split.get('compile_s', 0):5.2f} s compiling)"
                    )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
