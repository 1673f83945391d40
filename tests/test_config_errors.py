"""Config inputs that used to give tracebacks: a YAML tag in ``--set``, a directory as a
data path."""

import pytest

from experiments.cli import main
from experiments.config import parse_overrides, resolve_path

LTR_CONFIG = "experiments/configs/ltr_exposure.yaml"


@pytest.mark.parametrize("value", ["!!python/object:os.system", "!!python/name:os.system", "[1, 2", "{a: "])
def test_set_with_a_yaml_tag_or_bad_yaml_is_a_value_error_naming_the_key(value):
    with pytest.raises(ValueError, match=r"--set n: not a valid YAML value"):
        parse_overrides(["epochs=3", f"n={value}"])


def test_set_with_a_yaml_tag_exits_2_without_a_traceback(capsys):
    assert main(["ltr", "--config", LTR_CONFIG, "--set", "epochs=!!python/object:os.system"]) == 2
    err = capsys.readouterr().err
    assert "error: --set epochs: not a valid YAML value" in err and "Traceback" not in err


def test_data_path_that_is_a_directory(tmp_path, capsys):
    with pytest.raises(ValueError, match="is a directory"):
        resolve_path(str(tmp_path), None)
    (tmp_path / "sub").mkdir()
    config = tmp_path / "c.yaml"
    config.write_text("{}")
    with pytest.raises(ValueError, match="is a directory"):
        resolve_path("sub", str(config))  # relative to the config's folder
    assert main(["ltr", "--config", LTR_CONFIG, "--set", f"data={tmp_path}"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_sweep_letor_path_that_is_a_directory(tmp_path, capsys):
    args = [
        "sweep",
        "--config",
        "experiments/configs/semi_synthetic_yahoo.yaml",
        "--set",
        f"letor_path={tmp_path}",
        "--set",
        f"output_dir={tmp_path / 'out'}",
    ]
    assert main(args) == 2
    assert "is a directory" in capsys.readouterr().err
