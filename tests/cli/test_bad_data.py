"""Bad training data on the command line: an image that cannot be decoded, a class folder
without images. Each ends `keras-cait` with the contract's one line naming the file or folder
(docs/reliability.md), run as a user runs it: the console command, in a fresh process.

TensorFlow's decode error names an op, not a file; the run names it itself
(`keras_cait.training.image_checks.undecodable_named`, searching the data only after the failure),
so a Python caller gets the error naming the file and the command prints that error's line."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_cait.cli.errors import CommandFailed
from keras_cait.images.evaluation_transform import IMAGE_FORMATS
from keras_cait.training import RECIPES, image_checks, run, sources
from tests.conftest import TINY_CAIT, TINY_SIZE, write_digits

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAILURE = 1
TRAINING = ["--head-epochs", "1", "--epochs", "0", "--batch-size", "4", "--precision", "float32",
            "--verbose", "0"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny 3-class CaiT saved as .keras: `--model` of finetune (a new head) and evaluate."""
    from keras_cait.models.architecture import build_cait

    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=3).save(path)
    return str(path)


# === A bad image met mid-run: named by the library, and by the command in the same words ===


@pytest.fixture
def unchecked(monkeypatch):
    """The check before a run finds nothing, as on a folder too large to decode in its few seconds:
    the bad image is met only when the run reads it."""
    def nothing_found(source, *args, **kwargs):
        return image_checks.ImageCheck([], 0, source.num_examples, 0.0)

    monkeypatch.setattr(image_checks, "check_images", nothing_found)


@pytest.mark.large
@pytest.mark.parametrize("entry", ["finetune", "evaluate"])
def test_an_image_that_fails_to_decode_mid_run_is_named_from_python_and_the_command_alike(
        entry, unchecked, tiny_model, tmp_path, monkeypatch, capfd, policy):
    """The check is monkeypatched to pass; the truncated JPEG fails TensorFlow's decode while the
    run trains or evaluates. From Python: the run's error names the file; from the command: the
    same fields in flags, with the data opened once (no second look at the folder)."""
    from keras_cait.cli import main

    photos(tmp_path)
    truncated_jpeg(tmp_path / "photos" / "2" / "broken.jpg")
    broken = os.path.join(str(tmp_path), "photos", "2", "broken.jpg")
    data = str(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(run.RunError) as failed:
        if entry == "finetune":
            run.finetune(tiny_model, data, str(tmp_path / "python"), recipe=RECIPES["transfer"].replace(
                head_epochs=1, epochs=0, batch_size=4), precision="float32", verbose=0)
        else:
            run.evaluate(tiny_model, data, batch_size=4, verbose=0)
    error = failed.value
    assert (error.argument, error.value) == ("data", data)
    assert str(error) == (f"data={data!r}: {broken} cannot be decoded as an image ({IMAGE_FORMATS}): "
                          "invalid JPEG data (a truncated or damaged file); remove or replace it")

    opened = []
    source = sources.source
    monkeypatch.setattr(sources, "source", lambda *args, **kwargs: opened.append(args) or source(*args, **kwargs))
    argv = ["--data", data, "--model", tiny_model, "--batch-size", "4"]
    if entry == "finetune":
        argv += ["--output-dir", str(tmp_path / "command"), *TRAINING[:4], "--precision", "float32", "--verbose", "0"]
    capfd.readouterr()
    with pytest.raises(CommandFailed) as ended:
        main([entry, *argv])
    line = capfd.readouterr().err.rstrip("\n")
    assert line == str(ended.value) == f"keras-cait {entry}: --data {data}: " + str(error).split(": ", 1)[1]
    assert ended.value.code == FAILURE and len(opened) == 1, opened


# === The console command ===


def keras_cait(argv, cwd):
    """`keras-cait ARGV` in a fresh process, in `cwd`: (status, stdout, stderr)."""
    console = os.path.join(os.path.dirname(sys.executable), "keras-cait")
    command = [console] if os.path.exists(console) else [sys.executable, "-m", "keras_cait.cli"]
    environment = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"}
    environment.pop("KERAS_CAIT_DEBUG", None)
    done = subprocess.run(command + list(argv), cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


def the_line(status, err):
    """The one line of a failed command (status 1, nothing else on standard error)."""
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line on stderr:\n{err}"
    assert status == FAILURE, err
    return err.rstrip("\n")


def photos(root, **digits):
    """`root/photos`: 3 classes (0, 1, 2) of 4 digits each, 32x32 PNGs."""
    return write_digits(root / "photos", per_class=4, size=TINY_SIZE, classes=range(3), **digits)


def text_as_jpeg(path):
    path.write_text("This is not an image, whatever its name says.\n")


def truncated_jpeg(path):
    """A real JPEG cut in half: its header is a JPEG's, only a decode finds the fault."""
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.large
@pytest.mark.parametrize("damage", [text_as_jpeg, truncated_jpeg], ids=["text", "truncated"])
def test_finetune_on_an_undecodable_image_names_the_file(damage, tiny_model, tmp_path):
    photos(tmp_path)
    damage(tmp_path / "photos" / "1" / "broken.jpg")
    status, out, err = keras_cait(["finetune", "--data", "photos", "--output-dir", "runs/ft",
                                   "--model", tiny_model, *TRAINING], tmp_path)
    line = the_line(status, err)
    broken = os.path.join("photos", "1", "broken.jpg")
    assert line.startswith(f"keras-cait finetune: --data photos: {broken} cannot be decoded as an image "
                           f"({IMAGE_FORMATS}): "), line
    assert line.endswith("; remove or replace it"), line
    assert "DecodeImage" not in line and "{{" not in line and "[[" not in line, line


@pytest.mark.large
def test_several_undecodable_images_are_counted_and_named(tiny_model, tmp_path):
    photos(tmp_path)
    for name in ("0/a.jpg", "1/b.png", "2/c.gif"):
        text_as_jpeg(tmp_path / "photos" / name)
    (tmp_path / "photos" / "2" / "empty.jpg").write_bytes(b"")
    status, out, err = keras_cait(["finetune", "--data", "photos", "--output-dir", "runs/ft",
                                   "--model", tiny_model, *TRAINING], tmp_path)
    line = the_line(status, err)
    assert line.startswith("keras-cait finetune: --data photos: 4 files cannot be decoded as images"), line
    for name in ("0/a.jpg", "1/b.png", "2/c.gif", "2/empty.jpg"):
        assert os.path.join("photos", *name.split("/")) in line, line
    assert "(an empty file)" in line and line.endswith("; remove or replace them"), line


@pytest.mark.large
def test_an_undecodable_image_of_the_validation_data_names_its_flag(tiny_model, tmp_path):
    photos(tmp_path)
    write_digits(tmp_path / "val", per_class=2, size=TINY_SIZE, classes=range(3))
    text_as_jpeg(tmp_path / "val" / "2" / "broken.jpg")
    status, out, err = keras_cait(["finetune", "--data", "photos", "--val-data", "val", "--output-dir",
                                   "runs/ft", "--model", tiny_model, *TRAINING], tmp_path)
    line = the_line(status, err)
    broken = os.path.join("val", "2", "broken.jpg")
    assert line.startswith(f"keras-cait finetune: --val-data val: {broken} cannot be decoded"), line


@pytest.mark.large
def test_evaluate_on_an_undecodable_image_names_the_file(tiny_model, tmp_path):
    photos(tmp_path)
    truncated_jpeg(tmp_path / "photos" / "2" / "broken.jpg")
    status, out, err = keras_cait(["evaluate", "--data", "photos", "--model", tiny_model,
                                   "--batch-size", "4"], tmp_path)
    line = the_line(status, err)
    broken = os.path.join("photos", "2", "broken.jpg")
    assert line.startswith(f"keras-cait evaluate: --data photos: {broken} cannot be decoded as an "
                           "image"), line


@pytest.mark.large
def test_an_empty_class_folder_is_refused_by_name(tiny_model, tmp_path):
    photos(tmp_path)
    (tmp_path / "photos" / "dog").mkdir()
    (tmp_path / "photos" / ".ipynb_checkpoints").mkdir()  # hidden: not a class, not refused
    status, out, err = keras_cait(["finetune", "--data", "photos", "--output-dir", "runs/ft",
                                   "--model", tiny_model, *TRAINING], tmp_path)
    line = the_line(status, err)
    dog = os.path.join("photos", "dog")
    assert line == (f"keras-cait finetune: --data photos: The class folder '{dog}' holds no images "
                    f"({IMAGE_FORMATS} files: {', '.join(sources.IMAGE_EXTENSIONS)}); add images to it, or remove the "
                    "folder."), line
    assert not (tmp_path / "runs").exists()


@pytest.mark.large
def test_a_good_folder_still_trains(tiny_model, tmp_path):
    """The context that names bad images leaves a run on good data alone."""
    photos(tmp_path)
    shutil.copytree(tmp_path / "photos", tmp_path / "val")
    status, out, err = keras_cait(["finetune", "--data", "photos", "--val-data", "val", "--output-dir",
                                   "runs/ft", "--model", tiny_model, *TRAINING], tmp_path)
    assert status == 0, err
    assert (tmp_path / "runs" / "ft" / "final.keras").exists()


@pytest.mark.large
def test_the_check_before_training_names_the_files_and_stderr_holds_only_the_line(tiny_model, tmp_path):
    """libjpeg prints "Improper call to JPEG library in state 203" and "Input file read error" with
    fprintf (TF_CPP_MIN_LOG_LEVEL=3 does not hide them): they used to come before the line."""
    photos(tmp_path)
    cut = tmp_path / "photos" / "1" / "cut.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
        cut, format="JPEG", quality=90, progressive=True)
    cut.write_bytes(cut.read_bytes()[:600])
    (tmp_path / "photos" / "2" / "header.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
    status, out, err = keras_cait(["finetune", "--data", "photos", "--output-dir", "runs/ft",
                                   "--model", tiny_model, *TRAINING], tmp_path)
    line = the_line(status, err)
    assert line == (f"keras-cait finetune: --data photos: 2 files cannot be decoded as images ({IMAGE_FORMATS}): "
                    f"{os.path.join('photos', '1', 'cut.jpg')} (invalid JPEG data (a truncated or damaged file)), "
                    f"{os.path.join('photos', '2', 'header.jpg')} (invalid JPEG data (a truncated or damaged "
                    "file)); remove or replace them"), line
    assert not (tmp_path / "runs").exists()
