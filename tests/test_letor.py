"""LETOR loader: the real data shipped in simulators/data (facts from the data READMEs),
normalization, splits, and located errors for malformed files."""

import bz2
import gzip
from pathlib import Path

import numpy as np
import pytest

from simulators import datasets
from simulators.letor import LetorData, load_letor, normalize_per_query, split_queries, take_queries

YAHOO = Path(datasets.path("yahoo_sample"))
MSLR = Path(datasets.path("mslr_slice"))


@pytest.fixture(scope="module")
def yahoo() -> LetorData:
    return load_letor(YAHOO, n_features=300)


@pytest.fixture(scope="module")
def mslr() -> LetorData:
    return load_letor(MSLR, n_features=136)


def _check_padding(data: LetorData):
    q, d, f = data.features.shape
    assert data.labels.shape == data.mask.shape == (q, d)
    assert data.qids.shape == (q,)
    assert data.features.dtype == np.float32 and data.labels.dtype == np.float32
    assert data.mask.dtype == bool and data.qids.dtype == np.int64
    assert f == data.n_features
    n = data.mask.sum(axis=1)
    # the mask is a prefix of each row, and padding is exactly zero
    np.testing.assert_array_equal(data.mask, np.arange(d)[None, :] < n[:, None])
    assert not data.features[~data.mask].any()
    assert not data.labels[~data.mask].any()


# ----------------------------------------------------------------------------- real data


def test_yahoo_counts(yahoo):
    _check_padding(yahoo)
    n = yahoo.mask.sum(axis=1)
    assert yahoo.features.shape == (176, 25, 300)
    assert yahoo.n_features == 300
    assert int(n.sum()) == 2663
    assert (n.min(), np.median(n), n.max()) == (1, 15, 25)
    values, counts = np.unique(yahoo.labels[yahoo.mask], return_counts=True)
    assert dict(zip(values.tolist(), counts.tolist())) == {0: 565, 1: 1046, 2: 797, 3: 199, 4: 56}
    # qids ascending in the file, 1..251 with held-out positions (i % 10 in {2, 5, 8}) missing
    np.testing.assert_array_equal(yahoo.qids, np.sort(yahoo.qids))
    all_qids = np.arange(1, 252)
    held_out = np.isin(np.arange(251) % 10, [2, 5, 8])
    np.testing.assert_array_equal(yahoo.qids, all_qids[~held_out])
    # qid 1 is a single label-0 doc; qid 95 has only label-0 docs
    assert n[0] == 1 and yahoo.labels[0, 0] == 0
    q95 = int(np.flatnonzero(yahoo.qids == 95)[0])
    assert not yahoo.labels[q95].any() and n[q95] > 1


def test_yahoo_first_row_and_width(yahoo):
    # first line: "0 qid:1 10:0.89 11:0.75 12:0.01 17:0.45 ..."; absent features are 0
    row = yahoo.features[0, 0]
    assert row[9] == np.float32(0.89) and row[10] == np.float32(0.75) and row[11] == np.float32(0.01)
    assert row[16] == np.float32(0.45)
    assert row[0] == 0 and row[12] == 0
    # indices run up to 300, so the inferred width is also 300
    assert load_letor(YAHOO).n_features == 300


def test_mslr_counts_and_first_row(mslr):
    _check_padding(mslr)
    n = mslr.mask.sum(axis=1)
    assert mslr.features.shape == (8, 122, 136)
    np.testing.assert_array_equal(mslr.qids, [1, 4, 19, 31, 46, 49, 76, 91])
    assert int(n.sum()) == 718
    assert (n.min(), np.median(n), n.max()) == (45, 89, 122)
    values, counts = np.unique(mslr.labels[mslr.mask], return_counts=True)
    assert dict(zip(values.tolist(), counts.tolist())) == {0: 380, 1: 198, 2: 126, 3: 8, 4: 6}
    assert (mslr.labels.max(axis=1) > 0).all()  # every query has a relevant doc

    # the first line, parsed here by hand: all 136 dense values match exactly
    first = MSLR.read_text().splitlines()[0].split()
    assert first[:2] == ["2", "qid:1"]
    expected = np.zeros(136, np.float32)
    for tok in first[2:]:
        i, v = tok.split(":")
        expected[int(i) - 1] = np.float32(v)
    np.testing.assert_array_equal(mslr.features[0, 0], expected)
    assert mslr.labels[0, 0] == 2
    row = mslr.features[0, 0]
    assert row[0] == 3 and row[10] == 156 and row[15] == np.float32(6.931275)
    assert row[110] == np.float32(-18.567793) and row[127] == 11089534 and row[135] == 0


# ----------------------------------------------------------------------------- normalization


@pytest.mark.parametrize("method", ["minmax", "zscore"])
def test_normalize_real(mslr, method):
    out = normalize_per_query(mslr.features, mslr.mask, method)
    assert out.shape == mslr.features.shape and out.dtype == np.float32
    assert not out[~mslr.mask].any()
    m3 = mslr.mask[:, :, None]
    hi = np.where(m3, mslr.features, -np.inf).max(axis=1)
    lo = np.where(m3, mslr.features, np.inf).min(axis=1)
    varies = hi > lo  # [Q, F]
    assert (~varies).any() and varies.any()
    constant = np.broadcast_to(~varies[:, None, :], out.shape) & m3
    assert not out[constant].any()
    if method == "minmax":
        real = out[mslr.mask]
        assert real.min() >= 0 and real.max() <= 1
        np.testing.assert_allclose(np.where(m3, out, np.inf).min(axis=1)[varies], 0, atol=1e-6)
        np.testing.assert_allclose(np.where(m3, out, -np.inf).max(axis=1)[varies], 1, atol=1e-6)
    else:
        n = mslr.mask.sum(axis=1)[:, None]
        mean = np.where(m3, out, 0).sum(axis=1) / n
        var = np.where(m3, out.astype(np.float64) ** 2, 0).sum(axis=1) / n - mean**2
        np.testing.assert_allclose(mean[varies], 0, atol=1e-5)
        np.testing.assert_allclose(var[varies], 1, atol=1e-4)


def test_normalize_option_and_padding(yahoo):
    data = load_letor(YAHOO, n_features=300, normalize="minmax")
    np.testing.assert_array_equal(data.features, normalize_per_query(yahoo.features, yahoo.mask))
    np.testing.assert_array_equal(data.labels, yahoo.labels)
    _check_padding(data)
    # the single-document query 1 is all zeros after normalization
    assert not data.features[0].any()


def test_normalize_small_exact():
    feats = np.array([[[1.0, 5.0], [3.0, 5.0], [9.0, 9.0]]], np.float32)  # [1, 3, 2]
    mask = np.array([[True, True, False]])
    np.testing.assert_array_equal(normalize_per_query(feats, mask, "minmax"), [[[0, 0], [1, 0], [0, 0]]])
    np.testing.assert_allclose(normalize_per_query(feats, mask, "zscore"), [[[-1, 0], [1, 0], [0, 0]]])
    with pytest.raises(ValueError, match="method"):
        normalize_per_query(feats, mask, "l2")
    with pytest.raises(ValueError, match="mask"):
        normalize_per_query(feats, mask[:, :2], "minmax")


# ----------------------------------------------------------------------------- subsets


def test_split_queries(yahoo):
    train, test = split_queries(yahoo, (0.8, 0.2), seed=3)
    assert train.qids.shape == (141,) and test.qids.shape == (35,)
    both = np.concatenate([train.qids, test.qids])
    np.testing.assert_array_equal(np.sort(both), np.sort(yahoo.qids))  # exact partition
    for part in (train, test):
        assert part.features.shape[1:] == yahoo.features.shape[1:]
        pos = np.searchsorted(yahoo.qids, part.qids)  # yahoo qids are ascending
        assert (np.diff(pos) > 0).all()  # file order kept within a part
        np.testing.assert_array_equal(part.features, yahoo.features[pos])
        np.testing.assert_array_equal(part.labels, yahoo.labels[pos])
        np.testing.assert_array_equal(part.mask, yahoo.mask[pos])
    again = split_queries(yahoo, (0.8, 0.2), seed=3)
    np.testing.assert_array_equal(again[0].qids, train.qids)
    other = split_queries(yahoo, (0.8, 0.2), seed=4)
    assert not np.array_equal(other[0].qids, train.qids)
    parts = split_queries(yahoo, (0.5, 0.25, 0.25), seed=0)
    assert [p.qids.shape[0] for p in parts] == [88, 44, 44]
    assert np.unique(np.concatenate([p.qids for p in parts])).shape == (176,)
    for bad in [(0.5, 0.4), (1.2, -0.2), ()]:
        with pytest.raises(ValueError, match="fractions"):
            split_queries(yahoo, bad)


def test_take_queries(mslr):
    sub = take_queries(mslr, [3, 0])
    np.testing.assert_array_equal(sub.qids, [31, 1])
    np.testing.assert_array_equal(sub.features[1], mslr.features[0])
    sub = take_queries(mslr, mslr.qids > 40)
    np.testing.assert_array_equal(sub.qids, [46, 49, 76, 91])
    assert sub.features.shape == (4, 122, 136) and sub.path == mslr.path
    with pytest.raises(ValueError):
        take_queries(mslr, np.array([True, False]))


def test_max_docs_min_docs(yahoo):
    n = yahoo.mask.sum(axis=1)
    cut = load_letor(YAHOO, n_features=300, max_docs=10)
    _check_padding(cut)
    assert cut.features.shape == (176, 10, 300)
    np.testing.assert_array_equal(cut.mask.sum(axis=1), np.minimum(n, 10))
    np.testing.assert_array_equal(cut.features, yahoo.features[:, :10])  # first docs kept
    np.testing.assert_array_equal(cut.labels, yahoo.labels[:, :10])

    big = load_letor(YAHOO, n_features=300, min_docs=16)
    keep = n >= 16
    np.testing.assert_array_equal(big.qids, yahoo.qids[keep])
    np.testing.assert_array_equal(big.features, yahoo.features[keep])
    assert big.mask.sum(axis=1).min() >= 16

    both = load_letor(YAHOO, n_features=300, min_docs=20, max_docs=5)
    np.testing.assert_array_equal(both.qids, yahoo.qids[n >= 20])  # counted before truncation
    assert both.features.shape[1] == 5
    with pytest.raises(ValueError, match="min_docs"):
        load_letor(YAHOO, min_docs=26)
    with pytest.raises(ValueError, match="max_docs"):
        load_letor(YAHOO, max_docs=0)


# ----------------------------------------------------------------------------- small files


def test_unordered_qids_grouped_stably(tmp_path):
    p = tmp_path / "mixed.txt"
    p.write_text(
        "# a header comment\n2 qid:5 1:1.5 3:2 # doc a\n\n1 qid:2 2:7\n0 qid:5 1:-1\n3 qid:9\n1 qid:2 1:4 3:1\n"
    )
    data = load_letor(p)
    np.testing.assert_array_equal(data.qids, [5, 2, 9])
    assert data.n_features == 3 and data.path == str(p)
    np.testing.assert_array_equal(data.mask, [[1, 1], [1, 1], [1, 0]])
    np.testing.assert_array_equal(data.labels, [[2, 0], [1, 1], [3, 0]])
    np.testing.assert_array_equal(
        data.features,
        [[[1.5, 0, 2], [-1, 0, 0]], [[0, 7, 0], [4, 0, 1]], [[0, 0, 0], [0, 0, 0]]],
    )
    wide = load_letor(p, n_features=5)
    assert wide.features.shape == (3, 2, 5) and not wide.features[..., 3:].any()


@pytest.mark.parametrize("opener, suffix", [(gzip.open, ".gz"), (bz2.open, ".bz2")])
def test_compressed(tmp_path, opener, suffix):
    text = b"1 qid:1 1:0.5\n0 qid:1 2:1\n"
    p = tmp_path / f"small.txt{suffix}"
    with opener(p, "wb") as f:
        f.write(text)
    plain = tmp_path / "small.txt"
    plain.write_bytes(text)
    np.testing.assert_array_equal(load_letor(p).features, load_letor(plain).features)


GOOD = "1 qid:1 1:0.5 2:1\n"

BAD_FILES = {
    # name: (file text, 1-based bad line, words expected in the message)
    "missing_qid": ("# comment\n\n" + GOOD + "0 1:0.2 2:3\n", 4, "qid"),
    "missing_qid_first": ("0 1:0.2\n" + GOOD, 1, "qid"),
    "label_only": (GOOD + "2\n", 2, "qid"),
    "qid_not_second": (GOOD + "0 1:0.2 qid:1\n", 2, "qid"),
    "qid_not_int": (GOOD + "0 qid:x 1:1\n", 2, "query id"),
    "label_text": (GOOD + GOOD + "abc qid:1 1:0.2\n", 3, "label"),
    "label_missing": (GOOD + "qid:1 1:0.2\n", 2, "label"),
    "label_nan": (GOOD + "nan qid:1 1:0.2\n", 2, "label"),
    "token_no_colon": (GOOD + "0 qid:1 1:0.5 3\n", 2, "malformed"),
    "token_value_text": (GOOD + "0 qid:1 3:abc\n", 2, "value"),
    "token_value_empty": (GOOD + "0 qid:1 3:\n", 2, "value"),
    "token_index_text": (GOOD + "0 qid:1 a:1\n", 2, "index"),
    "token_index_float": (GOOD + "0 qid:1 1.5:1\n", 2, "index"),
    "token_double_colon": (GOOD + "0 qid:1 1:2:3\n", 2, "value"),
    "index_zero": (GOOD + "0 qid:1 0:1\n", 2, "1-based"),
    "index_negative": (GOOD + "0 qid:1 -2:1\n", 2, "1-based"),
    "index_huge": (GOOD + "0 qid:1 99999999999:1\n", 2, "too large"),
    "unsorted": (GOOD + "0 qid:1 3:1 2:1\n", 2, "increasing"),
    "duplicate": (GOOD + "0 qid:1 2:1 2:1\n", 2, "increasing"),
    "value_nan": (GOOD + GOOD + "0 qid:1 1:1 2:nan\n", 3, "not finite"),
    "value_overflow": (GOOD + "0 qid:1 1:1e40\n", 2, "not finite"),
    # finite in float64 but beyond float32 (checked before the cast, not stored as inf)
    "label_beyond_float32": (GOOD + "1e39 qid:1 1:0.2\n", 2, "float32"),
    "label_beyond_float32_negative": (GOOD + GOOD + "-1e39 qid:2 1:0.2\n", 3, "label"),
    "value_beyond_float32": (GOOD + "0 qid:1 1:1 2:1e39\n", 2, "float32"),
    "value_beyond_float32_negative": (GOOD + "0 qid:1 1:1 2:-4e38\n", 2, "feature 2"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_file_names_file_and_line(tmp_path, name):
    text, line, word = BAD_FILES[name]
    p = tmp_path / f"{name}.txt"
    p.write_text(text)
    with pytest.raises(ValueError) as err:
        load_letor(p)
    msg = str(err.value)
    assert str(p) in msg and f"line {line}:" in msg and word in msg, msg


def test_index_above_n_features(tmp_path):
    p = tmp_path / "wide.txt"
    p.write_text(GOOD + "0 qid:2 1:1 7:1\n")
    assert load_letor(p).n_features == 7
    with pytest.raises(ValueError, match=r"wide\.txt, line 2: feature index 7 exceeds n_features=5"):
        load_letor(p, n_features=5)


@pytest.mark.parametrize("text", ["", "# only a comment\n\n   \n"])
def test_empty_file(tmp_path, text):
    p = tmp_path / "empty.txt"
    p.write_text(text)
    with pytest.raises(ValueError, match="no data lines") as err:
        load_letor(p)
    assert str(p) in str(err.value)


def test_missing_file_and_bad_args(tmp_path):
    p = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_letor(p)
    q = tmp_path / "ok.txt"
    q.write_text(GOOD)
    with pytest.raises(ValueError, match="normalize"):
        load_letor(q, normalize="l2")
    with pytest.raises(TypeError, match="n_features"):
        load_letor(q, n_features=2.0)


# ----------------------------------------------------------------- memory and directories


def test_huge_feature_index_is_a_located_error_before_allocating(tmp_path):
    """A 4 KB file with one index of 2e6 used to allocate [Q, Dmax, 2e6] densely (GBs).
    The parse is sparse; the dense size is checked first and the error names the line."""
    import tracemalloc

    lines = [f"{i % 3} qid:{1 + i // 100} 1:0.5 3:1\n" for i in range(300)]
    lines.insert(137, "2 qid:2 1:0.1 2000000:1\n")  # line 138
    p = tmp_path / "wide.txt"
    p.write_text("".join(lines))
    assert p.stat().st_size < 8192
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as err:
            load_letor(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert str(p) in msg and "line 138:" in msg and "2000000" in msg, msg
    assert "GiB" in msg and "max_dense_bytes" in msg, msg
    assert peak < 64 * 2**20, peak  # nothing dense was allocated
    # a budget that fits reads it (3 queries x 101 docs x 2e6 float32 = 2.4 GB > 2 GiB; one query fits)
    one = tmp_path / "one.txt"
    one.write_text("1 qid:1 1:0.5\n0 qid:1 2000000:2\n")
    data = load_letor(one)
    assert data.features.shape == (1, 2, 2_000_000) and data.features[0, 1, -1] == 2.0


def test_feature_index_of_1e9_is_a_clear_error(tmp_path):
    p = tmp_path / "huge.txt"
    p.write_text("1 qid:1 1:0.5\n0 qid:1 2:1\n0 qid:2 1000000000:1\n")
    with pytest.raises(ValueError, match=r"huge\.txt, line 3: feature index 1000000000 .* GiB") as err:
        load_letor(p)
    assert "max_dense_bytes" in str(err.value)


def test_max_dense_bytes_budget(tmp_path):
    p = tmp_path / "small.txt"
    p.write_text(GOOD + "0 qid:1 1:1 7:1\n" + "0 qid:2 3:1\n")  # [2, 2, 7] features
    assert load_letor(p, max_dense_bytes=2 * 2 * (4 * 7 + 5)).features.shape == (2, 2, 7)
    with pytest.raises(ValueError, match=r"small\.txt, line 2: feature index 7 .*max_dense_bytes=100"):
        load_letor(p, max_dense_bytes=100)
    # with n_features given, the error points at the longest query
    with pytest.raises(ValueError, match=r"small\.txt, line 1: the longest query \(2 documents\)"):
        load_letor(p, n_features=50, max_dense_bytes=200)
    with pytest.raises(ValueError, match="max_dense_bytes must be >= 1"):
        load_letor(p, max_dense_bytes=0)


def test_labels_and_values_stay_exact_at_float32_limits(tmp_path):
    big = float(np.finfo(np.float32).max)
    p = tmp_path / "edge.txt"
    p.write_text(f"{big!r} qid:1 1:{-big!r}\n1e-45 qid:1 2:3.4e38\n")
    data = load_letor(p)
    assert data.labels[0, 0] == np.float32(big) and data.features[0, 0, 0] == -np.float32(big)
    assert np.all(np.isfinite(data.features)) and np.all(np.isfinite(data.labels))


def test_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        load_letor(tmp_path)


def test_sha256_is_checked_before_parsing(tmp_path):
    from simulators.letor import file_sha256

    path = tmp_path / "train.txt"
    path.write_text("2 qid:1 1:0.5 2:1\n0 qid:1 1:0.1 2:0\n")
    digest = file_sha256(path)
    assert load_letor(path, sha256=digest.upper()).features.shape == (1, 2, 2)
    path.write_text("2 qid:1 1:0.5 2:1\n")  # changed (truncated) file
    with pytest.raises(ValueError, match=f"sha256 is [0-9a-f]{{64}}, expected {digest}"):
        load_letor(path, sha256=digest)
