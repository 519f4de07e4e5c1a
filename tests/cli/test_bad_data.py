"""Bad training data on the command line: an image that cannot be decoded, a class folder
without images. Each ends `keras-cait` with the contract's one line naming the file or folder
(docs/reliability.md), run as a user runs it: the console command, in a fresh process.

TensorFlow's decode error names an op, not a file; `named_bad_images` (keras_cait/cli/errors.py)
searches the data for the file only after a run failed on one (the first tests, in this process)."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_cait.cli.errors import UserError, named_bad_images
from keras_cait.evaluation_transform import IMAGE_FORMATS
from keras_cait.training import sources, stream
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


# === The context that names them, in this process ===


def undecodable_folder(root, digits):
    folder = digits(root / "photos", per_class=2, size=8, classes=range(2))
    text_as_jpeg(root / "photos" / "1" / "broken.jpg")
    return sources.image_folder(folder)


def read_all(source):
    for _ in stream.evaluation_dataset(source, 8, 2):
        pass


def test_a_decode_error_becomes_the_line_naming_the_file(tmp_path, digits):
    source = undecodable_folder(tmp_path, digits)
    with pytest.raises(UserError) as failed:
        with named_bad_images("--data photos", source):
            read_all(source)
    broken = os.path.join(str(tmp_path), "photos", "1", "broken.jpg")
    assert str(failed.value) == (f"--data photos: {broken} cannot be decoded as an image ({IMAGE_FORMATS}): "
                                 "not an image file; remove or replace it.")
    assert failed.value.status == FAILURE
    assert isinstance(failed.value.__cause__, tf.errors.InvalidArgumentError)


def test_the_sources_are_opened_and_searched_only_after_a_decode_error(tmp_path, digits, monkeypatch):
    source = undecodable_folder(tmp_path, digits)
    monkeypatch.setattr(sources, "find_undecodable", lambda *args, **kwargs: pytest.fail("searched"))
    with named_bad_images("--data photos", source, ("--val-data v", lambda: pytest.fail("opened"))):
        pass


def test_other_errors_pass_unchanged(tmp_path, digits):
    source = undecodable_folder(tmp_path, digits)
    for error in (tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [4,3] vs. [4,10]"),
                  ValueError("another mistake"), tf.errors.ResourceExhaustedError(None, None, "OOM")):
        with pytest.raises(type(error)) as raised:
            with named_bad_images("--data photos", source):
                raise error
        assert raised.value is error


def test_a_decode_error_that_no_search_finds_keeps_its_traceback(tmp_path, digits):
    good = sources.image_folder(digits(tmp_path / "good", per_class=2, size=8, classes=range(2)))
    bad = undecodable_folder(tmp_path, digits)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown image file format"):
        with named_bad_images("--data good", good):  # the error is not of this data
            read_all(bad)


def test_the_validation_data_are_searched_under_their_flag(tmp_path, digits):
    good = sources.image_folder(digits(tmp_path / "good", per_class=2, size=8, classes=range(2)))
    bad = undecodable_folder(tmp_path, digits)
    with pytest.raises(UserError, match=r"^--val-data photos: .*broken\.jpg cannot be decoded"):
        with named_bad_images("--data good", good, ("--val-data photos", lambda: bad), ("--x", None)):
            read_all(bad)


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
    assert line.endswith("; remove or replace it."), line
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
    assert "(an empty file)" in line and line.endswith("; remove or replace them."), line


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
                    "file)); remove or replace them."), line
    assert not (tmp_path / "runs").exists()
