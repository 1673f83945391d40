"""The LETOR samples shipped in simulators/data: paths, checksums, documented counts, errors,
and ``dataset:NAME`` in configs (independent of the working directory)."""

import doctest
import fnmatch
import hashlib
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest

from experiments.config import resolve_path
from simulators import datasets

REPO_ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(datasets.DATASETS)


def test_the_two_samples_are_listed():
    assert NAMES == ["mslr_slice", "yahoo_sample"]
    import simulators

    assert simulators.datasets is datasets and "datasets" in simulators.__all__


@pytest.mark.parametrize("name", NAMES)
def test_path_is_an_absolute_file_inside_the_package(name):
    path = datasets.path(name)
    assert os.path.isabs(path) and os.path.isfile(path)
    package_data = Path(datasets.__file__).resolve().parent / "data"
    assert Path(path).resolve().parent.parent == package_data
    assert path.replace(os.sep, "/").endswith(datasets.DATASETS[name].file)
    # the README (provenance, licence) ships beside it and records the same checksum
    readme = Path(datasets.readme_path(name)).read_text(encoding="utf-8")
    assert readme.startswith("> **PROVENANCE of this copy.**")
    assert datasets.DATASETS[name].sha256 in readme
    assert "License caveat" in readme


@pytest.mark.parametrize("name", NAMES)
def test_sha256_verifies(name, monkeypatch):
    expected = hashlib.sha256(Path(datasets.path(name)).read_bytes()).hexdigest()
    assert datasets.verify(name) == expected == datasets.DATASETS[name].sha256
    wrong = datasets.DATASETS[name]._replace(sha256="0" * 64)
    monkeypatch.setitem(datasets.DATASETS, name, wrong)
    with pytest.raises(ValueError, match=f"dataset '{name}': sha256 of .* expected 0000"):
        datasets.verify(name)


@pytest.mark.parametrize("name", NAMES)
def test_load_gives_the_documented_counts(name):
    info = datasets.DATASETS[name]
    data = datasets.load(name)
    assert data.path == datasets.path(name)
    assert data.qids.shape == (info.n_queries,)
    assert int(data.mask.sum()) == info.n_docs
    assert data.n_features == data.features.shape[2] == info.n_features
    assert len(np.unique(data.qids)) == info.n_queries
    # keyword arguments go to load_letor
    cut = datasets.load(name, max_docs=5, normalize="minmax")
    assert cut.features.shape == (info.n_queries, 5, info.n_features)
    assert cut.features.min() >= 0.0 and cut.features.max() <= 1.0


def test_load_counts_match_the_readmes():
    yahoo = datasets.load("yahoo_sample")
    assert yahoo.features.shape == (176, 25, 300)
    mslr = datasets.load("mslr_slice", n_features=136)
    assert mslr.features.shape == (8, 122, 136)
    np.testing.assert_array_equal(mslr.qids, [1, 4, 19, 31, 46, 49, 76, 91])


@pytest.mark.parametrize("call", [datasets.path, datasets.load, datasets.verify, datasets.readme_path])
@pytest.mark.parametrize("bad", ["yahoo", "YAHOO_SAMPLE", "", "lightgbm_yahoo_sample"])
def test_unknown_name_lists_the_known_ones(call, bad):
    with pytest.raises(ValueError, match=rf"unknown dataset '{bad}'; known datasets: mslr_slice, yahoo_sample"):
        call(bad)


def test_a_missing_shipped_file_is_a_clear_error(monkeypatch):
    missing = datasets.DATASETS["yahoo_sample"]._replace(file="yahoo_sample/not_there.txt")
    monkeypatch.setitem(datasets.DATASETS, "yahoo_sample", missing)
    with pytest.raises(FileNotFoundError, match="installed without its package data"):
        datasets.path("yahoo_sample")
    with pytest.raises(ValueError, match="data file not found: dataset 'yahoo_sample'"):
        resolve_path("dataset:yahoo_sample", None)


def test_module_docstring_example_runs():
    result = doctest.testmod(datasets, raise_on_error=False, verbose=False)
    assert result.attempted >= 5 and result.failed == 0


def test_pyproject_ships_the_data_as_package_data():
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["simulators"]
    data_dir = Path(datasets.__file__).resolve().parent
    shipped = sorted(p.relative_to(data_dir).as_posix() for p in (data_dir / "data").rglob("*") if p.is_file())
    assert shipped == sorted(
        [f"data/{info.file}" for info in datasets.DATASETS.values()]
        + [f"data/{info.file.split('/')[0]}/README.md" for info in datasets.DATASETS.values()]
    )
    for rel in shipped:
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"{rel} is not matched by package-data {patterns}"


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize("name", NAMES)
def test_resolve_path_takes_dataset_names_from_any_working_directory(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "elsewhere" / "config.yaml"
    for config_path in (None, str(config), "relative/config.yaml"):
        assert resolve_path(f"dataset:{name}", config_path) == datasets.path(name)
    assert resolve_path(f"dataset: {name} ", None) == datasets.path(name)
    with pytest.raises(ValueError, match="unknown dataset 'nope'; known datasets: mslr_slice, yahoo_sample"):
        resolve_path("dataset:nope", str(config))
    # plain paths keep working: as written, else relative to the config's folder
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "data.txt").write_text("0 qid:1 1:0.5\n")
    assert resolve_path("data.txt", str(config)) == str(tmp_path / "elsewhere" / "data.txt")
    with pytest.raises(ValueError, match="data file not found"):
        resolve_path("missing.txt", str(config))


@pytest.mark.parametrize(
    "config,key,name",
    [
        ("semi_synthetic_yahoo.yaml", "letor_path", "yahoo_sample"),
        ("semi_synthetic_mslr.yaml", "letor_path", "mslr_slice"),
        ("pairwise_yahoo.yaml", "data", "yahoo_sample"),
        ("ltr_exposure.yaml", "data", "yahoo_sample"),
    ],
)
def test_real_data_configs_name_shipped_datasets_and_load_from_elsewhere(config, key, name, tmp_path, monkeypatch):
    from experiments.config import load_yaml

    path = REPO_ROOT / "experiments" / "configs" / config
    assert load_yaml(path)[key] == f"dataset:{name}"
    monkeypatch.chdir(tmp_path)  # neither the repository root nor the config's folder
    if key == "letor_path":
        from experiments.opl_sweep import load_sweep

        loaded = load_sweep(str(path), {})
    elif config.startswith("pairwise"):
        from experiments.pairwise_ltr import load_pairwise

        loaded = load_pairwise(str(path), {})
    else:
        from experiments.ltr import load_experiment

        loaded = load_experiment(str(path), {})
    assert getattr(loaded, key) == datasets.path(name)
