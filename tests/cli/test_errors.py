"""What a newcomer meets when something is wrong: one line naming the flag, never a traceback;
and the files a run leaves, loadable the way Keras users expect."""

import os
import warnings
import zipfile

import keras
import numpy as np
import pytest

from keras_cait.cli import main, runs


def one_line_error(arguments):
    with pytest.raises(SystemExit) as error:
        main(arguments)
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.fixture
def offline(monkeypatch, keras_cache):
    """No cached weights, and the hub's address refuses connections (port 9, discard)."""
    monkeypatch.setenv("KERAS_CAIT_HUB_URL", "http://127.0.0.1:9")


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "photo.jpg"
    keras.utils.save_img(path, np.random.default_rng(0).integers(0, 256, (40, 50, 3)).astype("uint8"))
    return str(path)


@pytest.mark.large
def test_predict_offline_with_the_default_weights_names_the_weights_flag(offline, image):
    message = one_line_error(["predict", image, "--model", "cait_xxs24_224"])
    assert message.startswith("keras-cait predict: Could not download the ImageNet weights of cait_xxs24_224")
    assert "--weights /path/to/model.safetensors" in message
    assert "--weights none" in message
    assert "weights='" not in message  # Python syntax is for the library, not the command line


def test_predict_reads_the_images_before_building_the_model(monkeypatch, no_network, tmp_path):
    import keras_cait.models.variants

    monkeypatch.setattr(keras_cait.models.variants, "cait", lambda *a, **k: pytest.fail("model built"))
    missing = str(tmp_path / "missing.jpg")
    message = one_line_error(["predict", missing])
    assert message == f"keras-cait predict: image {missing!r}: no such file; check the path."


def test_predict_of_a_truncated_jpeg_is_one_line_naming_the_file(image, tmp_path):
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(open(image, "rb").read()[:200])
    message = one_line_error(["predict", str(truncated), "--weights", "none",
                              "--model", "cait_xxs24_224"])
    assert message.startswith(f"keras-cait predict: Cannot read image {str(truncated)!r}")


@pytest.mark.large
@pytest.mark.parametrize("content", [b"", b"\x00" * 7, os.urandom(4096)], ids=["empty", "short", "random"])
def test_a_weights_file_that_is_not_a_checkpoint_is_one_line_naming_the_flag(image, tmp_path, content):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(content)
    message = one_line_error(["predict", image, "--weights", str(weights), "--model", "cait_xxs24_224"])
    assert message.startswith(f"keras-cait predict: --weights {weights}: ")


def test_evaluate_of_a_missing_keras_model_names_the_flag(tmp_path, digits):
    folder = digits(tmp_path / "digits", per_class=1)
    message = one_line_error(["evaluate", "--model", str(tmp_path / "nope.keras"), "--data", folder])
    assert message.startswith("keras-cait evaluate: --model ") and "no such file" in message


@pytest.mark.large
def test_evaluate_takes_the_input_size_of_a_keras_model(tiny_cait, digits, tmp_path, capsys):
    folder = digits(tmp_path / "digits", per_class=2)
    model_path = str(tmp_path / "model.keras")
    tiny_cait(classes=10).save(model_path)  # 32x32, not the default 224
    report = runs.evaluate_run(runs.evaluate_parser().parse_args(["--model", model_path, "--data", folder]))
    assert report["images"] == 20
    message = one_line_error(["evaluate", "--model", model_path, "--data", folder, "--image-size", "64"])
    assert "--image-size 64: the model takes 32x32 images" in message


def test_jit_flag_help_says_what_the_default_does():
    text = " ".join(runs.finetune_parser().format_help().split())
    # The default is Keras' jit_compile="auto": no XLA for TensorFlow on a CPU-only machine.
    assert ("--jit, --no-jit compile the training step with XLA where Keras' jit_compile='auto' does "
            "(not TensorFlow on a machine without GPUs); --no-jit: never (default: True)") in text


@pytest.mark.large
def test_finetune_writes_models_without_optimizer_state_that_load_silently(
    tiny_cait, digits, tmp_path, capsys, policy
):
    """best.keras and final.keras hold the architecture and the weights only: about the
    size of the weights, no optimizer variables, and Keras loads them without warnings."""
    folder = digits(tmp_path / "digits", per_class=4)
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(model_path)
    output_dir = tmp_path / "run"
    runs.finetune_run(runs.finetune_parser().parse_args([
        "--model", model_path, "--data", folder, "--output-dir", str(output_dir),
        "--batch-size", "8", "--precision", "mixed_float16", "--head-epochs", "1", "--epochs", "1",
        "--val-fraction", "0.25", "--no-jit", "--verbose", "0",
    ]))
    printed = capsys.readouterr().out
    assert "Stage 1 of 2: the new head alone" in printed and "Stage 2 of 2: the whole network" in printed
    policy("float32")  # the run set mixed_float16; load as a user would
    for name in ("best.keras", "final.keras"):
        path = output_dir / name
        with zipfile.ZipFile(path) as archive:
            assert "optimizer" not in archive.read("config.json").decode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = keras.models.load_model(path)
        assert not [str(w.message) for w in caught if "optimizer" in str(w.message)]
        assert model.input_shape == (None, 32, 32, 3)  # the .keras model's own size
        weights_bytes = sum(np.asarray(w).nbytes for w in model.weights)
        assert path.stat().st_size < 1.5 * weights_bytes  # an AdamW state would triple it


def test_predict_of_a_gif_frame_bomb_is_one_line_before_any_decoding(tmp_path):
    from tests.export.helpers import gif_of_frames

    bomb = tmp_path / "bomb.gif"  # a 64×64 screen holding a 12000×12000 frame
    bomb.write_bytes(gif_of_frames(2, (12_000, 12_000)))
    message = one_line_error(["predict", str(bomb), "--weights", "none", "--model", "cait_xxs24_224"])
    assert message.startswith(f"keras-cait predict: Image {str(bomb)!r} is 2 frames of 12000x12000 pixels")


# === Running out of memory ===

# What each command's line must name: the flags that lower its memory.
LESS_MEMORY = {
    "train": ("--batch-size", "--image-size"),
    "finetune": ("--batch-size", "--image-size"),
    "evaluate": ("--batch-size", "--image-size"),
    "predict": ("--batch-size", "--model"),
    "export": ("--model",),
}


def out_of_memory(kind):
    """The error a step raises when memory runs out: numpy's MemoryError, or TensorFlow's, whose
    message carries the graph's node and advice for TensorFlow developers."""
    import tensorflow as tf

    if kind == "MemoryError":
        return MemoryError("Unable to allocate 3.00 GiB for an array with shape (64, 8, 197, 197) and data type float32")
    return tf.errors.ResourceExhaustedError(
        None, None, "Graph execution error:\n\nDetected at node StatefulPartitionedCall defined at (most recent "
                    "call last):\n  File \"train.py\", line 1\n\nOOM when allocating tensor with shape[64,8,197,197] "
                    "and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu\n\t "
                    "[[{{node StatefulPartitionedCall}}]]\nHint: If you want to see a list of allocated tensors "
                    "when OOM happens, add report_tensor_allocations_upon_oom to RunOptions for current "
                    "allocation info.")


@pytest.mark.parametrize("kind", ["MemoryError", "ResourceExhaustedError"])
@pytest.mark.parametrize("command", list(LESS_MEMORY))
def test_running_out_of_memory_is_one_line_naming_what_to_lower(command, kind, tmp_path, monkeypatch, capfd):
    """The step that runs out is replaced by one raising the error (nothing this big is allocated)."""
    from keras_cait import export as exporters
    from keras_cait.cli import commands
    from keras_cait.models.architecture import CaiTModel, build_cait
    from tests.conftest import TINY_CAIT

    def step(*args, **kwargs):
        raise out_of_memory(kind)

    data = tmp_path / "photos"
    for label in ("cat", "dog"):
        (data / label).mkdir(parents=True)
    image = tmp_path / "photo.png"
    keras.utils.save_img(image, np.zeros((32, 32, 3), "uint8"))
    monkeypatch.setattr(commands, "_loaded", lambda *args, **kwargs: build_cait(**TINY_CAIT, input_shape=(32, 32, 3)))
    monkeypatch.setattr(runs.run, command, step, raising=False)
    monkeypatch.setattr(CaiTModel, "predict", step)
    monkeypatch.setattr(exporters, "export_saved_model", step)
    argv = {
        "train": ["train", "--data", str(data), "--output-dir", str(tmp_path / "run")],
        "finetune": ["finetune", "--data", str(data), "--output-dir", str(tmp_path / "run")],
        "evaluate": ["evaluate", "--data", str(data)],
        "predict": ["predict", str(image), "--weights", "none"],
        "export": ["export", str(tmp_path / "serving" / "1"), "--weights", "none"],
    }[command]
    capfd.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(argv)
    err = capfd.readouterr().err
    assert ended.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"keras-cait {command}: out of memory (")
    assert "shape[64,8,197,197]" in err or "shape (64, 8, 197, 197)" in err
    for flag in LESS_MEMORY[command]:
        assert flag in err, err
    assert "Hint" not in err and "node" not in err  # TensorFlow's advice is for its developers


@pytest.mark.large
def test_a_finetune_whose_training_step_runs_out_of_memory_ends_in_the_line(tiny_cait, digits, tmp_path, capfd, policy):
    """The real run, up to the first training step, which raises TensorFlow's out-of-memory error."""
    from keras_cait.models.architecture import CaiTModel

    folder = digits(tmp_path / "digits", per_class=2, classes=range(2))
    model_path = str(tmp_path / "pretrained.keras")
    tiny_cait(classes=10).save(model_path)

    def train_step(self, data):
        raise out_of_memory("ResourceExhaustedError")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CaiTModel, "train_step", train_step)
        capfd.readouterr()
        with pytest.raises(SystemExit) as ended:
            main(["finetune", "--model", model_path, "--data", folder, "--output-dir", str(tmp_path / "run"),
                  "--no-jit", "--verbose", "0", "--val-fraction", "0"])
    err = capfd.readouterr().err
    assert ended.value.code == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("keras-cait finetune: out of memory (OOM when allocating tensor with "
                                           "shape[64,8,197,197]); lower --batch-size or --image-size")


@pytest.mark.large
def test_an_export_without_its_extra_is_one_line_naming_the_pip_install(tmp_path, monkeypatch):
    """tf2onnx missing: the line names the extra that installs it, not Python's bare ModuleNotFoundError."""
    import sys

    for module in ("onnx", "tf2onnx"):
        monkeypatch.setitem(sys.modules, module, None)
    output = tmp_path / "cait.onnx"
    message = one_line_error(["export", str(output), "--weights", "none", "--model", "cait_xxs24_224"])
    assert message == 'keras-cait export: export_onnx needs onnx, which is not installed; pip install "keras-cait[onnx]"'
    assert not output.exists()


def test_every_argument_of_the_runs_is_written_as_a_flag_its_command_takes():
    """cli.errors.FLAGS is the one table from a library argument to its flag: each argument a run's
    error may name (its parameters, the recipe's knobs) is written as a flag the command parses."""
    import inspect

    from keras_cait.cli.errors import flag
    from keras_cait.training import recipe

    not_flags = {"fit_batch_to_data"}  # the command sets it from whether --batch-size was typed
    for command, function in (("train", runs.run.train), ("finetune", runs.run.finetune),
                              ("evaluate", runs.run.evaluate)):
        options = {option for action in runs.COMMANDS[command][0]()._actions for option in action.option_strings}
        names = [name for name in inspect.signature(function).parameters if name not in not_flags]
        if command == "evaluate":
            names.remove("verbose")  # evaluate's progress is Keras' own
        else:
            names += [knob for knob in recipe.knobs() if not (command == "train" and knob in runs._HEAD_KNOBS)]
        assert [name for name in names if flag(name) not in options] == [], command
