"""keras_cait.cli.runs (keras-cait train | finetune | evaluate): flags with their defaults, and evaluation numbers."""

import json
import os

import keras
import numpy as np
import pytest

from keras_cait.cli import runs
from keras_cait.cli.errors import UserError
from keras_cait.preprocessing import load_image
from keras_cait.training import sources, stream
from tests.conftest import TINY_CAIT


def test_evaluate_help_shows_the_defaults():
    """train's and finetune's defaults are their recipe's (test_recipe_flags.py)."""
    text = " ".join(runs.evaluate_parser().format_help().split())
    for fragment in ["(default: 1.0)", "(default: S24)", "(default: float32)", "(default: 64)"]:
        assert fragment in text


@pytest.mark.parametrize("command", ["train", "finetune", "evaluate"])
def test_help_shows_no_default_of_none_nor_of_a_required_flag_and_says_verbose_s(command):
    text = " ".join(getattr(runs, f"{command}_parser")().format_help().split())
    assert "(default: None)" not in text
    off_terminal = {"evaluate": 0}.get(command, 2)
    assert f"0 none (default: 1 on a terminal, {off_terminal} into a file or pipe)" in text


@pytest.mark.parametrize("terminal", [True, False])
def test_verbose_not_given_is_the_bar_on_a_terminal_and_lines_or_nothing_into_a_file(monkeypatch, terminal):
    """Keras' bar redraws itself with carriage returns and colour codes: into a file or a pipe, train and
    finetune write a line per epoch and evaluate its report alone; a --verbose given is kept."""
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    given = {"train": ["--output-dir", "out"], "finetune": ["--output-dir", "out"], "evaluate": []}
    for command, words in given.items():
        function = getattr(runs.run, command)
        args = runs.parse_arguments(command, ["--data", "folder", *words])
        assert runs._arguments(function, args)["verbose"] == (1 if terminal else {"evaluate": 0}.get(command, 2))
        args = runs.parse_arguments(command, ["--data", "folder", *words, "--verbose", "1"])
        assert runs._arguments(function, args)["verbose"] == 1


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
    with pytest.raises(UserError, match="has 10 classes but .* predicts 4"):
        runs.evaluate_run(args)
    keras.mixed_precision.set_global_policy("float32")


# === Runs of a mean-colour classifier: finetune's and evaluate's own work, in a second or two ===


def colour_model(path, classes, kernel=None, bias=None):
    """Saves a tiny CaiT classifier (`TINY_CAIT` at 32x32, random weights) as `.keras`, its
    `predictions` head set to `kernel` and `bias` where given (finetune keeps or replaces it)."""
    from keras_cait.models import build_cait
    from tests.conftest import TINY_CAIT, TINY_SIZE

    keras.utils.set_random_seed(0)
    model = build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=classes)
    if kernel is not None:
        model.get_layer("predictions").set_weights([np.asarray(kernel, "float32"), np.asarray(bias, "float32")])
    model.save(path)
    return str(path)


def write_images(folder, images):
    """{class: [uint8 (H, W, 3) images]} as PNG files in class subfolders; returns the folder."""
    from PIL import Image

    for name, pictures in images.items():
        os.makedirs(folder / name, exist_ok=True)
        for index, picture in enumerate(pictures):
            Image.fromarray(picture).save(folder / name / f"{index}.png")
    return str(folder)


def solid(colour, rng, side=32):
    noise = rng.integers(-10, 11, (side, side, 3))
    return np.clip(np.asarray(colour) + noise, 0, 255).astype("uint8")


FAST_RUN = ["--precision", "float32", "--no-jit", "--verbose", "0", "--val-fraction", "0"]


def test_the_head_stage_steps_at_the_recipe_s_head_rate(tmp_path):
    """Stage 1's AdamW runs at --head-lr × global batch / --lr-batch, not at --lr: its first step moves
    each bias of the head by that rate (Adam's first step is lr · g / (|g| + ε'))."""
    rng = np.random.default_rng(8)
    data = write_images(tmp_path / "data", {"dark": [solid((40, 40, 40), rng) for _ in range(5)],
                                            "light": [solid((200, 200, 200), rng) for _ in range(3)]})
    kernel, bias = rng.normal(0, 0.1, (TINY_CAIT["embed_dim"], 2)), rng.normal(0, 1, 2)
    start = colour_model(tmp_path / "start.keras", 2, kernel, bias)
    batch, lr_batch = int(rng.integers(5, 9)), int(rng.integers(16, 512))  # 8 images: one step
    head_lr = float(rng.uniform(1e-3, 1e-2))
    output = tmp_path / "run"
    runs.main("finetune", ["--model", start, "--data", data, "--output-dir", str(output), "--keep-head",
                           "--head-epochs", "1", "--epochs", "0", "--batch-size", str(batch),
                           "--head-lr", str(head_lr), "--lr", str(head_lr * 7), "--lr-batch", str(lr_batch),
                           *FAST_RUN])
    trained = keras.saving.load_model(output / "final.keras").get_layer("predictions").bias
    # float32 rounds a bias near 1 to about 1e-7, a few thousandths of the step; --lr's step would be 7 times it
    np.testing.assert_allclose(np.abs(np.asarray(trained) - bias), head_lr * batch / lr_batch, rtol=1e-2)


def test_finetune_names_each_class_as_the_label_it_trained_on(tmp_path):
    """The class names a fine-tuned model carries are in the order of the labels it learnt: after a few
    steps on three colours it names each colour after its folder (the folders 10, 2 and b, whose order
    as strings is not their order as numbers)."""
    rng = np.random.default_rng(9)
    colours = {"2": (230, 20, 20), "10": (20, 230, 20), "b": (20, 20, 230)}
    data = write_images(tmp_path / "data", {name: [solid(colour, rng) for _ in range(4)]
                                            for name, colour in colours.items()})
    start = colour_model(tmp_path / "start.keras", 5)  # a new head of 3 classes replaces its head
    output = tmp_path / "run"
    runs.main("finetune", ["--model", start, "--data", data, "--output-dir", str(output), "--head-epochs", "25",
                           "--epochs", "0", "--batch-size", "6", "--head-lr", "0.5", "--lr-batch", "6", *FAST_RUN])
    model = keras.saving.load_model(output / "final.keras")
    assert sorted(model.class_names) == sorted(colours)
    images = np.stack([solid(colour, rng) for colour in colours.values()]).astype("float32")
    predicted = [model.class_names[index] for index in model.predict(images, verbose=0).argmax(axis=1)]
    assert predicted == list(colours)


def test_evaluate_crop_pct_reaches_the_evaluation_transform(tmp_path, capsys):
    """`evaluate --crop-pct` decides what the model sees: a red square in the centre of a blue image is
    red in a tight centre crop and blue in the whole view (crop_pct 1.0). The top-1 reported is that of
    `load_image(file, 32, crop_pct)` through the model (scores: blue = mean B, red = mean R)."""
    rng = np.random.default_rng(10)
    framed = np.zeros((64, 64, 3), "uint8")
    framed[..., 2] = 220
    framed[16:48, 16:48] = (220, 0, 0)
    data = write_images(tmp_path / "data", {"blue": [solid((0, 0, 220), rng, 64) for _ in range(2)],
                                            "red": [framed] * 3})
    # A random tiny CaiT whose head scores "red" along the features' way from the whole red image's
    # to its tight centre crop's, the threshold between them: red in the crop, blue in the whole view.
    path = colour_model(tmp_path / "colour.keras", 2)
    model = keras.saving.load_model(path)
    features = keras.Model(model.input, model.get_layer("predictions").input)
    whole, tight = (keras.ops.convert_to_numpy(features(load_image(
        os.path.join(data, "red", "0.png"), 32, crop)[None]))[0] for crop in (1.0, 0.3))
    way = tight - whole
    threshold = float(way @ (whole + tight)) / 2
    model.get_layer("predictions").set_weights([np.stack([np.zeros_like(way), way], axis=1).astype("float32"),
                                                np.array([0.0, -threshold], "float32")])
    model.save(path)

    files = [(label, os.path.join(data, name, file)) for label, name in enumerate(["blue", "red"])
             for file in os.listdir(os.path.join(data, name))]

    def top1(crop_pct):
        images = np.stack([load_image(file, 32, crop_pct) for _, file in files])
        predicted = keras.ops.convert_to_numpy(model(images)).argmax(axis=1)
        return np.mean(predicted == [label for label, _ in files])

    crop_pct = float(rng.uniform(0.3, 0.65))
    assert top1(crop_pct) != top1(1.0)  # the data tell the crops apart
    runs.main("evaluate", ["--model", path, "--data", data, "--crop-pct", f"{crop_pct}", "--batch-size", "5"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["top1"] == pytest.approx(top1(crop_pct))
