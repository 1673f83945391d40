"""A saved policy's spec is covered by a checksum as well as its parameters, and its fields
are checked against each other: an edited or stripped ``policy.json`` is refused (naming the
file and the field) unless trusted explicitly, and an inconsistent one always
(docs/data_format.md, "Saved policies")."""

import hashlib
import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.cli import main
from opl_rank import LoggedData, PLPolicy, RegressionPolicy, TwoStagePolicy, make_key
from opl_rank.io.persistence import (
    FORMAT_VERSION,
    EditedPolicyWarning,
    load_policy,
    load_policy_and_spec,
    read_policy_spec,
    save_policy,
)
from opl_rank.metrics import dcg_position_weights
from opl_rank.opl.reward_models import RewardModel, _SlotValues
from opl_rank.scorers import make_scorer

D, L, K, DX = 5, 3, 2, 4


def _context() -> jax.Array:
    return jax.random.normal(make_key(5), (16, DX), jnp.float32)


def _pl(k: int) -> PLPolicy:
    module = make_scorer(D, ())
    return PLPolicy(module, module.init(make_key(1), _context()[:1]), k)


def _reward_model() -> RewardModel:
    module = _SlotValues(n_items=D, hidden=(), pairwise=False)
    params = module.init(make_key(3), _context()[:1], jnp.zeros((1, L), jnp.int32))
    return RewardModel("additive", module, params, dcg_position_weights(L))


def _two_stage() -> TwoStagePolicy:
    return TwoStagePolicy(_pl(K), _reward_model())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A k = 2 two-stage policy (L = 3, D = 5), saved once; tests edit copies."""
    directory = tmp_path_factory.mktemp("saved") / "policy"
    save_policy(_two_stage(), directory, metadata={"note": "original"})
    return directory


def _copy(saved, tmp_path, edit=None, rehash=False):
    """A copy of the saved policy, its policy.json edited by ``edit(document)``; ``rehash``:
    with the checksums recomputed as save_policy computes them (a deliberate forgery)."""
    directory = tmp_path / "edited"
    shutil.copytree(saved, directory)
    path = directory / "policy.json"
    document = json.loads(path.read_text())
    if edit is not None:
        edit(document)
    if rehash:
        _rehash(document)
    path.write_text(json.dumps(document, indent=2))
    return directory


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _rehash(document: dict) -> None:
    """The documented rule: field_sha256 = 16 hex digits per key (but the two checksums),
    spec_sha256 = SHA-256 of everything but itself."""
    document.pop("spec_sha256", None)
    document["field_sha256"] = {
        key: hashlib.sha256(_canonical(value)).hexdigest()[:16]
        for key, value in document.items()
        if key != "field_sha256"
    }
    document["spec_sha256"] = hashlib.sha256(_canonical(document)).hexdigest()


def _set_k(value):
    return lambda document: document.update(k=value)


def _set_first_stage_slots(value):
    return lambda document: document["policy"]["first_stage"].update(n_slots=value)


def test_a_fresh_save_carries_both_checksums_and_loads(saved):
    document = json.loads((saved / "policy.json").read_text())
    assert document["format_version"] == FORMAT_VERSION == "1.1"
    assert len(document["spec_sha256"]) == 64 and len(document["params_sha256"]) == 64
    assert set(document["field_sha256"]) == set(document) - {"field_sha256", "spec_sha256"}
    rehashed = dict(document)
    _rehash(rehashed)
    assert rehashed["spec_sha256"] == document["spec_sha256"]  # the documented rule is the one used
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for an intact policy
        policy, spec = load_policy_and_spec(saved)
    assert type(policy) is TwoStagePolicy and policy.k == K and spec["k"] == K
    assert read_policy_spec(saved) == spec


def test_an_edited_top_level_k_is_refused_naming_the_field(saved, tmp_path):
    directory = _copy(saved, tmp_path, _set_k(3))
    message = r"edited/policy.json: inconsistent policy spec: 'k' is 3 but policy.first_stage.n_slots"
    with pytest.raises(ValueError, match=message) as caught:
        load_policy(directory)
    assert "'k' differs from what was saved" in str(caught.value)
    with pytest.raises(ValueError, match=message):  # inconsistent: trusting it does not help
        load_policy(directory, trust_edited_spec=True)
    with pytest.raises(ValueError, match=message):
        read_policy_spec(directory)


def test_an_edited_first_stage_n_slots_is_refused(saved, tmp_path):
    directory = _copy(saved, tmp_path, _set_first_stage_slots(3))
    with pytest.raises(
        ValueError, match=r"policy.json: inconsistent policy spec: 'k' is 2 but policy.first_stage.n_slots .* is 3"
    ) as caught:
        load_policy(directory)
    assert "'policy' differs from what was saved" in str(caught.value)
    # edited consistently (k too): still an edit, refused unless trusted
    both = _copy(saved, tmp_path / "both", lambda d: (_set_k(3)(d), _set_first_stage_slots(3)(d)))
    with pytest.raises(ValueError, match=r"was edited after saving: 'k', 'policy' differ from what was saved"):
        load_policy(both)
    with pytest.warns(EditedPolicyWarning, match="'k', 'policy' differ"):
        assert load_policy(both, trust_edited_spec=True).k == 3


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("params_sha256", "the parameters cannot be checked"),
        ("spec_sha256", "edits to it cannot be detected"),
    ],
)
def test_a_removed_checksum_is_refused_unless_trusted(saved, tmp_path, key, says):
    directory = _copy(saved, tmp_path, lambda document: document.pop(key))
    with pytest.raises(
        ValueError, match=rf"edited/policy.json: has no '{key}' \(removed after saving\?\): {says}"
    ) as e:
        load_policy(directory)
    assert "--trust-edited-policy" in str(e.value) and "trust_edited_spec=True" in str(e.value)
    with pytest.warns(EditedPolicyWarning, match=rf"policy.json: has no '{key}'.*loading it anyway"):
        policy = load_policy(directory, trust_edited_spec=True)
    assert type(policy) is TwoStagePolicy and policy.k == K


def test_an_edit_elsewhere_is_refused_and_the_override_loads_it_with_a_warning(saved, tmp_path):
    def edit(document):
        document["policy"]["n_samples"] = 64
        document["metadata"]["note"] = "edited"

    directory = _copy(saved, tmp_path, edit)
    with pytest.raises(ValueError, match=r"was edited after saving: 'metadata', 'policy' differ") as caught:
        load_policy(directory)
    assert "save the policy again" in str(caught.value)
    with pytest.warns(EditedPolicyWarning, match="was edited after saving") as record:
        policy = load_policy(directory, trust_edited_spec=True)
    assert policy.n_samples == 64
    assert record[0].filename == __file__  # the warning points at the caller's line
    with pytest.warns(EditedPolicyWarning):
        assert read_policy_spec(directory, trust_edited_spec=True)["metadata"]["note"] == "edited"


def test_a_format_1_0_file_is_refused_with_how_to_proceed_and_resaving_upgrades_it(saved, tmp_path):
    def as_1_0(document):
        document.pop("spec_sha256")
        document.pop("field_sha256")
        document["format_version"] = "1.0"

    directory = _copy(saved, tmp_path, as_1_0)
    with pytest.raises(
        ValueError, match=r"policy.json: written in format 1.0 .* before saved specs had a checksum"
    ) as e:
        load_policy(directory)
    assert "save the policy again" in str(e.value) and "--trust-edited-policy" in str(e.value)
    with pytest.warns(EditedPolicyWarning):
        old = read_policy_spec(directory, trust_edited_spec=True)
        policy = load_policy(directory, trust_edited_spec=True)
    save_policy(policy, directory, config=old["config"], metadata=old["metadata"])  # docs/data_format.md's recipe
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_policy_spec(directory)["format_version"] == FORMAT_VERSION
        assert load_policy(directory).k == K


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_set_k(3), "'k' is 3 but policy.first_stage.n_slots"),
        (_set_k(4), "'k' is 4, outside [0, n_slots=3]"),
        (_set_k("2"), "'k' must be an int, got '2'"),
        (_set_k(True), "'k' must be an int, got True"),
        (_set_first_stage_slots(1), "'k' is 2 but policy.first_stage.n_slots (the first stage's k) is 1"),
        (lambda d: d.update(n_slots=2), "'n_slots' is 2 but policy.reward_model.n_slots is 3"),
        (lambda d: d.update(n_slots=0), "'n_slots' (L) is 0, outside [1, n_items=5]"),
        (lambda d: d.update(n_items=6), "'n_items' is 6 but policy.reward_model.module.n_items is 5"),
        (
            lambda d: d["policy"]["first_stage"]["scorer"].update(n_items=6),
            "policy.first_stage.scorer.n_items is 6 but policy.reward_model.module.n_items is 5",
        ),
        (
            lambda d: d["policy"]["reward_model"]["module"].update(prefix_slots=3),
            "policy.reward_model.module.prefix_slots is 3, more than the first stage's k=2",
        ),
        (lambda d: d.pop("context_dim"), "'context_dim' must be an int, got None"),
    ],
)
def test_inconsistent_fields_are_refused_even_with_recomputed_checksums(saved, tmp_path, edit, says):
    directory = _copy(saved, tmp_path, edit, rehash=True)
    for trust in (False, True):
        with pytest.raises(ValueError, match=r"edited/policy.json: inconsistent policy spec: ") as caught:
            load_policy(directory, trust_edited_spec=trust)
        assert says in str(caught.value)
        assert "edited after saving" not in str(caught.value)  # the checksums match: only the contradiction


@pytest.mark.parametrize(
    ("policy", "edit", "says"),
    [
        (lambda: _pl(L), _set_k(2), "'k' is 2 but policy.n_slots (a PLPolicy samples all its slots) is 3"),
        (lambda: RegressionPolicy(_reward_model()), _set_k(1), "'k' is 1 but a RegressionPolicy's k"),
    ],
)
def test_k_is_the_policys_own_for_every_class(tmp_path, policy, edit, says):
    save_policy(policy(), tmp_path / "p")
    directory = _copy(tmp_path / "p", tmp_path, edit, rehash=True)
    with pytest.raises(ValueError, match="inconsistent policy spec") as caught:
        load_policy(directory)
    assert says in str(caught.value)


def test_a_plugin_class_is_checked_against_its_rebuilt_sizes(tmp_path):
    from tests.plugins.epsilon_greedy import EpsilonGreedyPolicy

    save_policy(EpsilonGreedyPolicy(RegressionPolicy(_reward_model()), 0.1, D), tmp_path / "p")
    assert type(load_policy(tmp_path / "p")) is EpsilonGreedyPolicy
    directory = _copy(tmp_path / "p", tmp_path, _set_k(2), rehash=True)
    with pytest.raises(ValueError, match=r"'k' is 2 but the rebuilt EpsilonGreedyPolicy has k=0"):
        load_policy(directory, trust_edited_spec=True)


# -- the command line ------------------------------------------------------------------


@pytest.fixture(scope="module")
def logs_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    n = 40
    ranking = np.stack([rng.permutation(D)[:L] for _ in range(n)]).astype(np.int32)
    data = LoggedData(
        context=rng.normal(size=(n, DX)).astype(np.float32),
        ranking=ranking,
        reward=rng.binomial(1, 0.3, (n, L)).astype(np.float32),
        log_pi0_prefix=np.cumsum(np.log(np.full((n, L), 1.0 / 3.0)), axis=1).astype(np.float32),
        position_weight=np.asarray(dcg_position_weights(L), np.float32),
        n_items=D,
    )
    path = tmp_path_factory.mktemp("logs") / "logs.parquet"
    data.to_parquet(path)
    return path


def test_cli_refuses_an_edited_policy_in_one_line(saved, tmp_path, logs_file, capsys):
    directory = _copy(saved, tmp_path, _set_k(3))
    out = tmp_path / "ranked.parquet"
    for args in (
        ["evaluate", "--policy", str(directory), "--data", str(logs_file)],
        ["evaluate", "--policy", str(directory), "--data", str(logs_file), "--trust-edited-policy"],
        ["rank", "--policy", str(directory), "--contexts", str(logs_file), "--out", str(out)],
    ):
        assert main(args) == 2, args
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, captured.err
        assert lines[0].startswith(f"opl-rank {args[0]}: error: --policy {directory}/policy.json: inconsistent")
        assert "'k' is 3" in lines[0]
        assert captured.out == ""
    assert not out.exists()


def test_cli_trust_edited_policy_loads_it_with_a_warning(saved, tmp_path, logs_file, capsys):
    directory = _copy(saved, tmp_path, lambda document: document["metadata"].update(note="edited"))
    out = tmp_path / "ranked.parquet"
    rank = ["rank", "--policy", str(directory), "--contexts", str(logs_file), "--out", str(out), "--json"]
    assert main(rank) == 2
    err = capsys.readouterr().err
    assert "was edited after saving: 'metadata' differs" in err and "--trust-edited-policy" in err
    with pytest.warns(EditedPolicyWarning, match="'metadata' differs"):
        assert main([*rank, "--trust-edited-policy"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 40 and out.exists()
    evaluate = ["evaluate", "--policy", str(directory), "--data", str(logs_file), "--estimators", "ips", "--json"]
    with pytest.warns(EditedPolicyWarning, match="'metadata' differs"):
        assert main([*evaluate, "--trust-edited-policy"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["k"] == K and list(report["estimates"]) == ["ips"]


def test_params_file_must_stay_in_the_policy_folder(saved, tmp_path):
    """Even with the checksums forged, the parameters are read from beside policy.json only."""
    directory = _copy(saved, tmp_path, edit=lambda d: d.update(params_file="../elsewhere.msgpack"), rehash=True)
    with pytest.raises(ValueError, match="params_file must be a file name"):
        load_policy(directory, trust_edited_spec=True)
