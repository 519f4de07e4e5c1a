"""The `keras-cait` command line, run in-process through `keras_cait.cli.main`."""

import os
import re

import keras
import numpy as np
import pytest
from PIL import Image

import keras_cait
from keras_cait.cli import main

PREDICTION_LINE = re.compile(r"^ +(\d+\.\d\d)%  (.+) \((n\d{8})\)$")


@pytest.fixture
def checkpoint(timm_reference):
    """A random cait_xxs24_224 in timm's format and the timm model it came from."""
    reference = timm_reference.model("cait_xxs24_224")
    return timm_reference.save(reference), reference


@pytest.mark.large
def test_predict_prints_the_top_5_of_the_reference_evaluation(checkpoint, tmp_path, capsys):
    """The CLI's image loading (bicubic resize of the shorter side, centre crop) and the
    model's own normalisation must give what timm's evaluation transform for this
    checkpoint gives, fed to the same weights without normalisation. The loader is
    keras_cait.images.evaluation_transform (TF's bicubic), whose pixels differ from PIL's by
    rounding only; on this noise image that moves the probabilities by < 1 %."""
    from timm.data import create_transform, resolve_data_config

    path, reference = checkpoint
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (256, 320, 3), dtype=np.uint8))
    image_path = str(tmp_path / "noise.png")
    image.save(image_path)
    evaluation = create_transform(**resolve_data_config({}, model=reference))
    pixels = evaluation(image).numpy().transpose(1, 2, 0)[None]
    model = keras_cait.CaiT_XXS24(weights=path, include_preprocessing=False)
    expected = keras_cait.decode_predictions(keras.ops.convert_to_numpy(model(pixels)), top=5)[0]

    main(["predict", image_path, "--model", "cait_xxs24_224", "--weights", str(path)])

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == image_path
    assert len(lines) == 6
    printed = [PREDICTION_LINE.match(line).groups() for line in lines[1:]]
    assert [(name, wnid) for _, name, wnid in printed] == [(name, wnid) for wnid, name, _ in expected]
    np.testing.assert_allclose(
        [float(percent) for percent, _, _ in printed],
        [100 * score for _, _, score in expected],
        rtol=1e-2,  # TF's bicubic and PIL's round differently (measured: 0.7 %)
        atol=0.0051,  # printed with 2 decimals
    )


@pytest.mark.large
def test_convert_writes_keras_weights_with_the_checkpoint_logits(
    checkpoint, tmp_path, timm_reference, capsys
):
    path, reference = checkpoint
    output = tmp_path / "cait_xxs24_224.weights.h5"
    images = timm_reference.images(2, 224)
    expected, _ = timm_reference.outputs(reference, images)

    main(["convert", str(path), str(output), "--model", "cait_xxs24_224"])

    assert f"wrote {output} (11,956,264 parameters)" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == sorted([path.name, output.name])
    model = keras_cait.CaiT_XXS24(weights=str(output), classifier_activation=None)
    timm_reference.assert_matches(keras.ops.convert_to_numpy(model(images)), expected, "logits")


def test_convert_refuses_an_output_that_is_not_weights_h5(checkpoint, tmp_path):
    path, _ = checkpoint
    output = str(tmp_path / "cait.h5")

    with pytest.raises(SystemExit, match=f"--output {output!r} must end in .weights.h5"):
        main(["convert", str(path), output, "--model", "cait_xxs24_224"])

    assert not os.path.exists(output)


@pytest.mark.parametrize("command", ["predict", "convert", "export", "train", "finetune", "evaluate"])
@pytest.mark.parametrize("name", ["cait_zz99", "cait_s24_big", "vit_base_patch16_224", "S24_224_1"])
def test_unknown_model_is_a_clear_error(command, name, tmp_path):
    arguments = {
        "predict": ["predict", "image.png", "--weights", "none", "--model", name],
        "convert": ["convert", "model.safetensors", str(tmp_path / "out.weights.h5"), "--model", name],
        "export": ["export", str(tmp_path / "m.onnx"), "--weights", "none", "--model", name],
        "train": ["train", "--data", str(tmp_path), "--output-dir", str(tmp_path / "o"), "--model", name],
        "finetune": ["finetune", "--data", str(tmp_path), "--output-dir", str(tmp_path / "o"),
                     "--model", name],
        "evaluate": ["evaluate", "--data", str(tmp_path), "--model", name],
    }[command]

    with pytest.raises(SystemExit) as error:
        main(arguments)

    message = str(error.value)
    assert "--model" in message and name in message and "unknown CaiT model" in message
    assert ", ".join(keras_cait.VARIANTS) in message  # every variant, in the table's order
    assert "e.g. XXS24, cait_xxs24 or cait_xxs24_224" in message
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("name", ["cait_xxs24_224", "cait_xxs24", "XXS24", "xxs24", "CaiT_XXS24_224"])
@pytest.mark.parametrize("command", ["predict", "finetune", "evaluate"])
def test_every_command_takes_every_form_of_a_model_name(command, name, tmp_path):
    """The name passes; the command goes on to the next mistake (a missing image or folder)."""
    missing = str(tmp_path / "missing")
    arguments = {
        "predict": ["predict", missing + ".png", "--weights", "none", "--model", name],
        "finetune": ["finetune", "--data", missing, "--output-dir", str(tmp_path / "o"), "--model", name],
        "evaluate": ["evaluate", "--data", missing, "--model", name],
    }[command]

    with pytest.raises((SystemExit, FileNotFoundError)) as error:
        main(arguments)

    assert "missing" in str(error.value) and "unknown CaiT model" not in str(error.value)


class _Built(Exception):
    """Raised by the stand-in for build_cait: the model would have been built here."""


@pytest.mark.parametrize("name, side", [("cait_xs24", 384), ("cait_s36", 384), ("cait_m48", 448), ("S24", 224)])
def test_a_named_model_runs_at_one_size_in_every_command_the_size_weights_imagenet_loads(
    name, side, digits, tmp_path, monkeypatch
):
    """cait_xs24 has one checkpoint, at 384: predict, evaluate, finetune and CaiT_XS24() all build
    it at 384 (evaluate once built it at 224 and resized the 384 checkpoint)."""
    from keras_cait.models import variants

    built = []

    def build_cait(**arguments):
        built.append(tuple(arguments["input_shape"]))
        raise _Built

    monkeypatch.setattr(variants, "build_cait", build_cait)
    folder = digits(tmp_path / "digits", per_class=1, classes=range(2))
    image = os.path.join(folder, "0", sorted(os.listdir(os.path.join(folder, "0")))[0])
    commands = {
        "constructor": lambda: variants.cait(name),
        "predict": lambda: main(["predict", image, "--model", name, "--weights", "none"]),
        "evaluate": lambda: main(["evaluate", "--data", folder, "--model", name, "--weights", "none"]),
        "finetune": lambda: main(["finetune", "--data", folder, "--output-dir", str(tmp_path / "run"),
                                  "--model", name, "--weights", "none", "--precision", "float32", "--batch-size", "1",
                                  "--val-fraction", "0"]),
    }
    try:
        for command in commands.values():
            with pytest.raises(_Built):
                command()
    finally:
        keras.mixed_precision.set_global_policy("float32")

    assert dict(zip(commands, built)) == dict.fromkeys(commands, (side, side, 3))
    assert variants.default_image_size(name) == side
    checkpoint = variants.select_checkpoint(variants.parse_model_name(name)[0], side, side)
    assert variants.CHECKPOINTS[checkpoint]["resolution"] == side, "the checkpoint loads unresized"


def test_train_finetune_and_evaluate_are_subcommands_with_their_own_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listing = capsys.readouterr().out
    for command in ("train", "finetune", "evaluate"):
        assert f"keras-cait {command} --help for the flags" in " ".join(listing.split())

    with pytest.raises(SystemExit) as done:
        main(["evaluate", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: keras-cait evaluate")
    assert "--crop-pct CROP_PCT evaluation centre crop fraction (CaiT: 1.0) (default: 1.0)" in text

    with pytest.raises(SystemExit) as done:
        main(["train"])  # --data and --output-dir are required
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        "keras-cait train: the following arguments are required: --data, --output-dir; "
        "see keras-cait train --help\n"
    )


@pytest.fixture(scope="module")
def saved_classifier(tmp_path_factory):
    """A tiny random CaiT of 4 named classes saved as a .keras file, and the model."""
    from keras_cait.models.architecture import build_cait
    from tests.conftest import TINY_CAIT, TINY_SIZE
    from tests.layers.reference import randomize

    model = build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=4)
    randomize(model, seed=5, scale=0.2)
    model.class_names = ["wolf", "ant", "yak", "emu"]
    path = tmp_path_factory.mktemp("saved") / "model.keras"
    model.save(path)
    return str(path), model


@pytest.mark.large
@pytest.mark.parametrize("name", ["model.onnx", "model.tflite", "model.xml"])
def test_export_takes_a_keras_file_for_every_file_format(saved_classifier, name, tmp_path, capsys):
    path, model = saved_classifier
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    main(["export", str(tmp_path / name), "--model", path])
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / name}"
    if name.endswith(".onnx"):
        import onnxruntime

        session = onnxruntime.InferenceSession(str(tmp_path / name))
        scores = session.run(None, {session.get_inputs()[0].name: images})[0]
    elif name.endswith(".tflite"):
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(str(tmp_path / name))
        runner = interpreter.get_signature_runner()
        scores = next(iter(runner(**{next(iter(runner.get_input_details())): images}).values()))
    else:
        import openvino

        # float32 as documented: on a CPU with bfloat16 units OpenVINO would compute in bf16
        compiled = openvino.Core().compile_model(
            str(tmp_path / name), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        scores = compiled(images)[0]
    np.testing.assert_allclose(scores, model.predict(images, verbose=0), atol=1e-4)


def test_predict_prints_the_class_names_a_keras_file_carries(saved_classifier, tmp_path, capsys):
    path, model = saved_classifier
    image = str(tmp_path / "noise.png")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(image)
    main(["predict", image, "--model", path])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == image
    from keras_cait.preprocessing import load_image

    scores = model.predict(load_image(image, 32)[None], verbose=0)[0]
    best = [model.class_names[i] for i in np.argsort(-scores)]
    assert [line.split()[1] for line in lines[1:]] == best  # all 4 of 4, best first, by name


def test_a_keras_file_with_weights_is_refused_naming_both(saved_classifier, tmp_path, capsys):
    path, _ = saved_classifier
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path / "serving" / "1"), "--model", path, "--weights", "none"])
    error = capsys.readouterr().err
    assert f"--weights none applies to a CaiT name; --model {path} holds its own weights" in error
    assert not (tmp_path / "serving").exists()


def test_a_keras_file_without_class_scores_is_refused_by_predict_and_export(tiny_cait, tmp_path, capsys):
    path = str(tmp_path / "headless.keras")
    tiny_cait(include_top=False).save(path)  # the token sequence
    image = str(tmp_path / "noise.png")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(image)

    for arguments in (["predict", image], ["export", str(tmp_path / "serving" / "1")]):
        with pytest.raises(SystemExit):
            main([*arguments, "--model", path])
        assert f"--model {path}: outputs (None, 5, 64), not class scores (batch, classes)" in capsys.readouterr().err
    assert not (tmp_path / "serving").exists()


@pytest.mark.large
def test_export_names_the_classes_of_a_model_without_names_from_a_class_names_file(tiny_cait, tmp_path, capsys):
    """A .keras classifier whose classes have no names (a Python-built one) is exported with
    --class-names FILE, one name a line; the SavedModel's top_k_classes answer those names."""
    import tensorflow as tf

    path = str(tmp_path / "unnamed.keras")
    model = tiny_cait(classes=3)
    model.save(path)
    names = tmp_path / "names.txt"
    names.write_text("sparrow\nrobin\n\nwren\n")  # blank lines are skipped, as for train's --class-names
    version = tmp_path / "serving" / "1"

    main(["export", str(version), "--model", path, "--class-names", str(names), "--top-k", "3"])

    assert capsys.readouterr().out == f"wrote {version}\n"
    images = np.random.default_rng(2).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    served = tf.saved_model.load(str(version)).signatures["serving_default"](images=tf.constant(images))
    order = np.argsort(-model.predict(images, verbose=0), axis=-1, kind="stable")
    expected = np.array(["sparrow", "robin", "wren"])[order]
    assert served["top_k_classes"].numpy().astype(str).tolist() == expected.tolist()
