"""The head's training accuracy set beside the measured rates (`run`, `profile`): read from the head
folder's training_metrics.json or --train-acc; predicted u_i = prod acc_j, tau = 1 + sum u_i."""

import json
import math
import shutil

import pytest
from click.testing import CliRunner

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.settings import ConfigError, ProfileOptions, Settings


def _cfg(tiny, draft=None, **kw):
    return Settings.of(target=str(tiny["target"]), draft=str(draft or tiny["head"]), prompts=str(tiny["prompts"]),
                     max_new_tokens=12, num_steps=4, **kw)


@pytest.fixture
def head_with_metrics(tiny, tmp_path):
    head = tmp_path / "head"
    shutil.copytree(tiny["head"], head)
    (head / "training_metrics.json").write_text(json.dumps({"validation": {"acc": [0.9, 0.5, 0.25]}}))
    return head


def test_the_head_folder_file_is_read_and_predicts_per_position(tiny, head_with_metrics):
    report = api.evaluate(_cfg(tiny, draft=head_with_metrics), progress=False).report
    pred = report["training_prediction"]
    assert pred["acc"] == [0.9, 0.5, 0.25] and "training_metrics.json" in pred["source"]
    assert pred["positions_predicted"] == 3                       # training covered 3 of the 4 steps
    predicted = [r["predicted_unconditional_rate"] for r in pred["per_position"]]
    assert predicted[:3] == pytest.approx([0.9, 0.45, 0.1125]) and predicted[3] is None
    assert pred["predicted_accept_length"] == pytest.approx(1 + 0.9 + 0.45 + 0.1125)
    measured = [p["unconditional_rate"] for p in report["per_position"]]
    assert [r["measured_unconditional_rate"] for r in pred["per_position"]] == measured
    assert pred["measured_accept_length_same_positions"] == pytest.approx(1 + sum(measured[:3]))
    assert report["config"]["train_acc"]["acc"] == [0.9, 0.5, 0.25]


def test_command_line_accuracy_wins_and_profile_shows_it(tiny, head_with_metrics):
    report = api.profile(_cfg(tiny, draft=head_with_metrics, train_acc=(0.5, 0.5)), ProfileOptions(max_steps=3),
                         progress=False).report
    for s, sec in report["by_num_steps"].items():
        pred = sec["training_prediction"]
        k = min(2, int(s))
        assert pred["source"] == "--train-acc" and pred["positions_predicted"] == k
        assert pred["predicted_accept_length"] == pytest.approx(1 + sum(0.5 ** (i + 1) for i in range(k)))


def test_without_accuracy_there_is_no_prediction(tiny):
    report = api.evaluate(_cfg(tiny), progress=False).report
    assert "training_prediction" not in report and report["config"]["train_acc"] is None


@pytest.mark.parametrize("text, message", [
    ("{not json", "not readable JSON"),
    (json.dumps({"validation": {"loss": 1.0}}), "no per-step accuracy list"),
    (json.dumps({"acc": [0.9, 1.5]}), "numbers in [0, 1]"),
])
def test_a_bad_metrics_file_is_one_line_naming_it(tiny, tmp_path, text, message):
    head = tmp_path / "head"
    shutil.copytree(tiny["head"], head)
    (head / "training_metrics.json").write_text(text)
    result = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", str(head),
                                       "--prompts", str(tiny["prompts"]), "--max-new-tokens", "4"])
    assert result.exit_code == 2 and "training_metrics.json" in result.output and message in result.output
    assert "Traceback" not in result.output


def test_train_acc_option_is_checked():
    with pytest.raises(ConfigError, match="--train-acc"):
        Settings.of(train_acc=(0.9, 1.2))
    result = CliRunner().invoke(main, ["run", "--train-acc", "0.9,x"])
    assert result.exit_code == 2 and "--train-acc must be comma-separated numbers" in result.output
    assert math.isclose(Settings.of(train_acc=[0.5]).model.train_acc[0], 0.5)
