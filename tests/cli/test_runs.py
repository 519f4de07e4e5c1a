"""keras_cait.cli.runs (keras-cait train | finetune | evaluate): flags with their defaults, and evaluation numbers."""

import json

import keras
import numpy as np
import pytest

from keras_cait.cli import runs
from keras_cait.cli.errors import UserError
from keras_cait.training import sources, stream


def test_evaluate_help_shows_the_defaults():
    """train's and finetune's defaults are their recipe's (test_recipe_flags.py)."""
    text = " ".join(runs.evaluate_parser().format_help().split())
    for fragment in ["(default: 1.0)", "(default: S24)", "(default: float32)", "(default: 64)"]:
        assert fragment in text


@pytest.mark.large
def test_evaluate_reports_top1_and_top5(tiny_cait, digits, tmp_path, capsys):
    folder = digits(tmp_path / "digits", per_class=6)
    model = tiny_cait(classes=10)
    model_path = str(tmp_path / "model.keras")
    model.save(model_path)
    args = runs.evaluate_parser().parse_args(
        ["--model", model_path, "--data", folder, "--image-size", "32", "--batch-size", "16"]
    )
    report = runs.evaluate_run(args)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report

    source = sources.image_folder(folder)
    images, labels = zip(*stream.evaluation_dataset(source, 32, 60).unbatch())
    scores = model.predict(np.stack(images), verbose=0)
    ranks = np.argsort(-scores, axis=1)
    labels = np.array(labels)
    assert report["images"] == 60
    assert report["top1"] == pytest.approx(np.mean(ranks[:, 0] == labels))
    assert report["top5"] == pytest.approx(np.mean(np.any(ranks[:, :5] == labels[:, None], axis=1)))


def test_evaluate_refuses_a_class_count_mismatch(tiny_cait, digits, tmp_path):
    folder = digits(tmp_path / "digits", per_class=1)
    model_path = str(tmp_path / "model.keras")
    tiny_cait(classes=4).save(model_path)
    args = runs.evaluate_parser().parse_args(["--model", model_path, "--data", folder])
    with pytest.raises(UserError, match="predicts 4 classes but .* has 10"):
        runs.evaluate_run(args)
    keras.mixed_precision.set_global_policy("float32")
