"""keras_cait.cli.runs (keras-cait train | finetune | evaluate): flags with their defaults, and evaluation numbers."""

import json

import keras
import numpy as np
import pytest

from keras_cait.cli import runs
from keras_cait.cli.errors import UserError
from keras_cait.training import sources, stream


@pytest.mark.parametrize(
    "parser, expected",
    [
        (runs.train_parser, ["--epochs EPOCHS  training epochs (default: 400)",
                             "(default: 0.0005)", "(default: 0.05)", "(default: 0.8)",
                             "(default: 0.25)", "(default: 3)", "(default: 0.99996)",
                             "(default: 1e-06)", "(default: 1e-05)", "(default: 9)",
                             "(default: mixed_float16)"]),
        (runs.finetune_parser, ["(default: imagenet)", "(default: 2)", "(default: 1e-05)",
                                "(default: 0.1)"]),
        (runs.evaluate_parser, ["(default: 1.0)", "(default: S24)"]),
    ],
    ids=["train", "finetune", "evaluate"],
)
def test_help_shows_the_defaults(parser, expected):
    text = " ".join(parser().format_help().split())
    for fragment in expected:
        assert " ".join(fragment.split()) in text


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
