"""The command line's error contract, row by row: every subcommand against bad input.

A user's mistake ends `keras-cait <command>` with exactly one line on standard error,
`keras-cait <command>: <what is wrong>; <what to do>`, exit status 2 when the command line
cannot work and 1 for anything else, no traceback, and nothing left behind. Each row of
`ROWS` is one mistake: the command line (`{name}` is a file of the row's folder, see
`workspace`), the status, and the words the line must hold (the flag or path at fault).
A row may read what it names in `reads` ("data": list an image folder, "model": build or
load one); anything else it touches fails the row, so each one stays cheap and proves that
the mistake is found before the work starts.

docs/reliability.md links this table; the rows that need permissions to bite run as a
user other than root (`test_permission_row`).
"""

import dataclasses
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from PIL import Image

from keras_cait.cli import main
from keras_cait.cli.errors import CommandFailed

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USAGE, FAILURE = 2, 1


@dataclasses.dataclass(frozen=True)
class Row:
    argv: str  # split on spaces; {name} is a path of `workspace`
    status: int
    names: tuple  # words the line must hold, after {name} expansion
    reads: tuple = ()  # "data" and/or "model": what the row may read before failing


def row(argv, status, *names, reads=()):
    return Row(argv, status, names, tuple(reads.split()) if isinstance(reads, str) else reads)


TRAIN = "train --data {digits} --output-dir {tmp}/run"
FINETUNE = "finetune --data {digits} --output-dir {tmp}/run"
EVALUATE = "evaluate --data {digits}"

ROWS = {
    # --- predict ---
    "predict/missing-image": row("predict {tmp}/missing.jpg", FAILURE, "{tmp}/missing.jpg", "no such file"),
    "predict/image-is-a-folder": row("predict {folder}", FAILURE, "{folder}", "is a folder"),
    "predict/web-address": row("predict http://127.0.0.1:9/x.jpg", FAILURE, "http://127.0.0.1:9/x.jpg",
                               "download the image"),
    "predict/not-an-image": row("predict {garbage}.jpg", FAILURE, "{garbage}.jpg"),
    "predict/top-0": row("predict {image} --top 0", USAGE, "--top 0", "between 1 and 1000"),
    "predict/top-1001": row("predict {image} --top 1001", USAGE, "--top 1001"),
    "predict/unknown-model": row("predict {image} --model cait_zz99", USAGE, "--model cait_zz99", "cait_xxs24_224"),
    "predict/no-image": row("predict", USAGE, "IMAGE", "keras-cait predict --help"),
    "predict/unknown-flag": row("predict {image} --topp 3", USAGE, "--topp", "keras-cait predict --help"),
    "predict/missing-weights": row("predict {image} --model cait_xxs24_224 --weights {tmp}/missing.safetensors",
                                   FAILURE, "--weights {tmp}/missing.safetensors", reads="model"),
    "predict/weights-not-a-checkpoint": row(
        "predict {image} --model cait_xxs24_224 --weights {garbage}.safetensors", FAILURE,
        "--weights {garbage}.safetensors", reads="model"),
    "predict/keras-model-not-of-images": row("predict {image} --model {dense}", FAILURE, "--model {dense}",
                                             "(None, 8)", "not images", reads="model"),
    "predict/keras-model-not-a-cait": row("predict {image} --model {notcait}", FAILURE, "--model {notcait}",
                                          "not a CaiT", "variant name", reads="model"),
    "export/keras-model-not-a-cait": row("export {tmp}/serving/1 --model {notcait}", FAILURE, "--model {notcait}",
                                         "not a CaiT", reads="model"),
    "predict/offline-imagenet-weights": row("predict {image} --model cait_xxs24_224", FAILURE,
                                            "--weights /path/to/model.safetensors", "--weights none",
                                            reads="model"),
    # --- convert ---
    "convert/missing-checkpoint": row("convert {tmp}/missing.safetensors {tmp}/out.weights.h5 --model "
                                      "cait_xxs24_224", FAILURE, "{tmp}/missing.safetensors", "no such file"),
    "convert/checkpoint-is-a-folder": row("convert {folder} {tmp}/out.weights.h5 --model cait_xxs24_224",
                                          FAILURE, "{folder}", "is a folder"),
    "convert/output-not-weights-h5": row("convert {garbage}.safetensors {tmp}/out.h5 --model cait_xxs24_224",
                                         USAGE, "{tmp}/out.h5", ".weights.h5"),
    "convert/no-resolution": row("convert {garbage}.safetensors {tmp}/out.weights.h5 --model cait_xxs24",
                                 USAGE, "--model cait_xxs24", "cait_xxs24_384"),
    "convert/no-model-flag": row("convert {garbage}.safetensors {tmp}/out.weights.h5", USAGE, "--model"),
    "convert/output-inside-a-file": row("convert {garbage}.safetensors {afile}/out.weights.h5 --model "
                                        "cait_xxs24_224", FAILURE, "{afile}", "not a folder"),
    "convert/output-is-a-folder": row("convert {garbage}.safetensors {folder} --model cait_xxs24_224",
                                      USAGE, "{folder}"),
    "convert/checkpoint-not-a-checkpoint": row("convert {garbage}.safetensors {tmp}/out.weights.h5 --model "
                                               "cait_xxs24_224", FAILURE, "{garbage}.safetensors",
                                               reads="model"),
    # --- export ---
    "export/top-k-0": row("export {tmp}/serving/1 --weights none --top-k 0", USAGE, "--top-k 0"),
    "export/top-k-5000": row("export {tmp}/serving/1 --weights none --top-k 5000", USAGE, "--top-k 5000",
                             "between 1 and 1000"),
    "export/top-k-with-onnx": row("export {tmp}/cait.onnx --weights none --top-k 3", USAGE, "--top-k",
                                  "SavedModels only"),
    "export/suffix-no-format-writes": row("export {tmp}/model.pt --weights none", USAGE, "{tmp}/model.pt: no export "
                                          "format writes a .pt file", ".onnx (ONNX)", ".tflite (LiteRT)",
                                          ".xml (OpenVINO)", "version folder"),
    "export/not-a-version-folder": row("export {tmp}/serving/latest --weights none", USAGE,
                                       "{tmp}/serving/latest", "{tmp}/serving/latest/1"),
    "export/version-exists": row("export {existing}/1 --weights none", FAILURE, "{existing}/1",
                                 "--overwrite"),
    "export/openvino-int8": row("export {tmp}/cait.xml --weights none --quantization int8", USAGE,
                                "--quantization int8", "OpenVINO"),
    "export/base-is-a-file": row("export {afile}/1 --weights none", FAILURE, "{afile}", "not a folder"),
    "export/unknown-model": row("export {tmp}/serving/1 --model cait_zz99", USAGE, "cait_zz99"),
    "export/missing-weights": row("export {tmp}/serving/1 --model cait_xxs24_224 --weights "
                                  "{tmp}/missing.safetensors", FAILURE, "--weights {tmp}/missing.safetensors",
                                  reads="model"),
    "export/dynamic-int8-to-a-saved-model": row("export {tmp}/serving/1 --weights none --quantization dynamic_int8",
                                                USAGE, "--quantization dynamic_int8", "a .tflite file"),
    "export/bfloat16-to-onnx": row("export {tmp}/cait.onnx --weights none --compute-dtype bfloat16", USAGE,
                                   "--compute-dtype bfloat16", "ONNX", "SavedModel"),
    "export/no-class-names": row("export {tmp}/serving/1 --model {model}", FAILURE, "--model {model}",
                                 "10 classes", "--class-names FILE", reads="model"),
    "export/class-names-count": row("export {tmp}/serving/1 --model {model} --class-names {names}", FAILURE,
                                    "--class-names {names}", "3 names", "10 classes", reads="model"),
    "export/repeated-class-names": row("export {tmp}/serving/1 --model {model} --class-names {repeated}", FAILURE,
                                       "--class-names {repeated}", "repeats class3", "its own name",
                                       reads="model"),
    "export/missing-class-names": row("export {tmp}/serving/1 --model {model} --class-names {tmp}/missing.txt",
                                      FAILURE, "--class-names {tmp}/missing.txt", "no such file"),
    "export/class-names-with-onnx": row("export {tmp}/cait.onnx --model {model} --class-names {names}", USAGE,
                                        "--class-names", "SavedModel"),
    # --- attention ---
    "attention/out-not-png": row("attention {image} --out {tmp}/maps.jpg", USAGE, "{tmp}/maps.jpg", ".png"),
    "attention/missing-image": row("attention {tmp}/missing.jpg --out {tmp}/maps.png", FAILURE,
                                   "{tmp}/missing.jpg"),
    "attention/out-inside-a-file": row("attention {image} --out {afile}/maps.png", FAILURE, "{afile}",
                                       "not a folder"),
    "attention/out-is-a-folder": row("attention {image} --out {pngfolder}", FAILURE, "{pngfolder}",
                                     "is a folder"),
    "attention/missing-keras-model": row("attention {image} --out {tmp}/maps.png --model {tmp}/missing.keras",
                                         FAILURE, "{tmp}/missing.keras", "no such file"),
    "attention/keras-model-not-a-model": row("attention {image} --out {tmp}/maps.png --model "
                                             "{garbage}.keras", FAILURE, "{garbage}.keras", reads="model"),
    "attention/keras-model-not-a-cait": row("attention {image} --out {tmp}/maps.png --model {notcait}", FAILURE,
                                            "--model {notcait}", "not a CaiT", reads="model"),
    "attention/unknown-model": row("attention {image} --out {tmp}/maps.png --model cait_zz99", USAGE,
                                   "cait_zz99"),
    # --- demo ---
    "demo/epochs-0": row("demo --epochs 0 --out {tmp}/demo", USAGE, "--epochs 0"),
    "demo/out-is-a-file": row("demo --out {afile}", FAILURE, "--out {afile}", "not a folder"),
    "demo/unknown-init": row("demo --init bogus --out {tmp}/demo", USAGE, "--init", "bogus"),
    # --- train ---
    "train/missing-data": row("train --data {tmp}/missing --output-dir {tmp}/run", FAILURE,
                              "--data {tmp}/missing", "no such folder"),
    "train/epochs-within-warmup": row(TRAIN + " --epochs 4", USAGE, "--warmup-epochs 5", "--epochs 4"),
    "train/batch-size-0": row(TRAIN + " --batch-size 0", USAGE, "--batch-size 0"),
    "train/image-size-not-patches": row(TRAIN + " --image-size 30", USAGE, "--image-size 30", "--image-size 32"),
    "train/json-patch-size": row(TRAIN + ' --model {"embed_dim":64,"depth":2,"num_heads":4,"init_values":1e-5,'
                                 '"patch_size":8}'
                                 " --image-size 36", USAGE, "--image-size 36", "patch size 8"),
    "train/unknown-variant": row(TRAIN + " --model ZZ99", USAGE, "--model", "'ZZ99'", "S24", "JSON"),
    "train/json-model-without-init-values": row(TRAIN + ' --model {"embed_dim":64,"depth":2,"num_heads":4}', USAGE,
                                                '--model {"embed_dim":64,"depth":2,"num_heads":4}', "init_values",
                                                '"init_values":1e-05'),
    "train/json-model-heads-not-dividing": row(TRAIN + ' --model {"embed_dim":64,"depth":2,"num_heads":5,'
                                               '"init_values":1e-5}', USAGE, "--model", "build_cait's num_heads=5",
                                               "embed_dim=64"),
    "train/json-model-misspelt-argument": row(TRAIN + ' --model {"embed_dim":64,"depht":2,"num_heads":4,'
                                              '"init_values":1e-5}', USAGE, "--model", "depht, not an argument of "
                                              "build_cait", "depth"),
    "train/json-model-run-argument": row(TRAIN + ' --model {"embed_dim":64,"depth":2,"num_heads":4,'
                                         '"init_values":1e-5,"classes":3}', USAGE, "--model", "gives classes, which "
                                         "the run sets itself"),
    "train/model-not-json": row(TRAIN + " --model {embed_dim", USAGE, "--model {embed_dim", "JSON"),
    "train/output-dir-is-a-file": row("train --data {digits} --output-dir {afile}", FAILURE,
                                      "--output-dir {afile}", "not a folder"),
    "train/batch-larger-than-data": row(TRAIN + " --batch-size 64", USAGE, "--batch-size 64", "4 training images",
                                        "give --batch-size 4 or less", "leave --batch-size out", reads="data"),
    "train/tfrecords-without-class-names": row("train --data tfrecord:{tmp}/*.tfrecord --output-dir {tmp}/run",
                                               USAGE, "tfrecord:{tmp}/*.tfrecord", "--class-names"),
    "train/repeated-class-names": row("train --data tfrecord:{tmp}/x --class-names {repeated} --output-dir {tmp}/run",
                                      FAILURE, "--class-names {repeated}", "repeats class3", "its own name"),
    "train/missing-class-names": row("train --data tfrecord:{tmp}/x --class-names {tmp}/names.txt "
                                     "--output-dir {tmp}/run", FAILURE, "--class-names {tmp}/names.txt"),
    "train/teacher-without-distillation": row(TRAIN + " --teacher {tmp}/t.keras", USAGE, "--teacher",
                                              "--distillation-type"),
    "train/distillation-without-teacher": row(TRAIN + " --distillation-type hard", USAGE,
                                              "--distillation-type hard", "--teacher"),
    "train/repeated-aug-0": row(TRAIN + " --repeated-aug 0", USAGE, "--repeated-aug 0"),
    "train/no-images": row("train --data {empty} --output-dir {tmp}/run", FAILURE, "--data {empty}",
                           "no images", reads="data"),
    "train/no-output-dir": row("train --data {digits}", USAGE, "--output-dir", "keras-cait train --help"),
    # --- finetune ---
    "finetune/missing-keras-model": row(FINETUNE + " --model {tmp}/missing.keras", FAILURE,
                                        "{tmp}/missing.keras", "no such file"),
    "finetune/unknown-variant": row(FINETUNE + " --model ZZ99", USAGE, "--model", "'ZZ99'", ".keras"),
    "finetune/val-fraction-above-1": row(FINETUNE + " --val-fraction 1.5", USAGE, "--val-fraction 1.5"),
    "finetune/backup-every-0": row(FINETUNE + " --backup-every 0", USAGE, "--backup-every 0", "at least 1"),
    "train/shuffle-buffer-0": row(TRAIN + " --shuffle-buffer 0", USAGE, "--shuffle-buffer 0", "at least 1"),
    "finetune/nothing-to-train": row(FINETUNE + " --epochs 0 --head-epochs 0", USAGE, "--epochs 0",
                                     "--head-epochs 0"),
    "finetune/highres-epochs-within-warmup": row(FINETUNE + " --recipe deit-highres --epochs 3", USAGE,
                                                 "--warmup-epochs 5", "--epochs 3"),
    "finetune/negative-lora-rank": row(FINETUNE + " --lora-rank -1", USAGE, "--lora-rank -1"),
    "finetune/image-size-not-patches": row(FINETUNE + " --image-size 100", USAGE, "--image-size 100",
                                           "--image-size 96"),
    "finetune/model-without-its-flag": row("finetune XXS24 --data {digits} --output-dir {tmp}/run", USAGE, "XXS24",
                                           "give the model as --model XXS24"),
    "finetune/folder-without-its-flag": row("finetune {digits} --output-dir {tmp}/run", USAGE, "--data",
                                            "give the folder as --data {digits}"),
    "evaluate/keras-file-without-its-flag": row("evaluate {model} --data {digits}", USAGE,
                                                "give the model as --model {model}"),
    "finetune/weights-without-a-value": row(FINETUNE + " --weights", USAGE, "--weights", "expected one argument"),
    "train/recipe-without-a-value": row(TRAIN + " --recipe", USAGE, "--recipe", "expected one argument"),
    "finetune/missing-data": row("finetune --data {tmp}/missing --output-dir {tmp}/run", FAILURE,
                                 "--data {tmp}/missing"),
    "finetune/batch-larger-than-data": row(FINETUNE + " --batch-size 8 --val-fraction 0", USAGE,
                                           "--batch-size 8", "leave --batch-size out", reads="data"),
    "finetune/keras-model-not-a-cait": row(FINETUNE + " --model {notcait}", FAILURE, "--model {notcait}",
                                           "not a CaiT", "variant", reads="data model"),
    "finetune/keras-model-not-of-images": row(FINETUNE + " --model {dense}", FAILURE, "--model {dense}",
                                              "(None, 8)", "not images", "CaiT variant", reads="data model"),
    "finetune/keras-model-not-a-cait-at-another-size": row(FINETUNE + " --model {notcait} --image-size 64", FAILURE,
                                                           "--model {notcait}", "not a CaiT", reads="data model"),
    "evaluate/keras-model-not-a-cait": row(EVALUATE + " --model {notcait}", FAILURE, "--model {notcait}: holds",
                                           "not a CaiT", reads="data model"),
    "finetune/one-class": row("finetune --data {oneclass} --output-dir {tmp}/run", FAILURE, "--data {oneclass}",
                              "holds 1 class", reads="data"),
    "evaluate/keras-model-not-of-images": row(EVALUATE + " --model {dense}", FAILURE, "--model {dense}", "(None, 8)",
                                              "not images", reads="data model"),
    "finetune/val-data-with-val-fraction": row(FINETUNE + " --val-data {digits} --val-fraction 0.2", USAGE,
                                               "--val-fraction 0.2: not with --val-data {digits}"),
    "finetune/class-of-one-image": row("finetune --data {lonely} --output-dir {tmp}/run", FAILURE,
                                       "--data {lonely}", "'{lonely}/1' holds 1 image", "--val-fraction 0",
                                       "--val-data FOLDER", reads="data"),
    "finetune/undecodable-images": row("finetune --data {broken} --output-dir {tmp}/run", FAILURE,
                                       "--data {broken}: 2 files", "{broken}/0/notes.jpg", "{broken}/1/cut.jpg",
                                       reads="data"),
    # --- evaluate ---
    "evaluate/missing-data": row("evaluate --data {tmp}/missing", FAILURE, "--data {tmp}/missing"),
    "evaluate/undecodable-images": row("evaluate --data {broken}", FAILURE, "--data {broken}: 2 files",
                                       "{broken}/0/notes.jpg", reads="data"),
    "evaluate/missing-keras-model": row(EVALUATE + " --model {tmp}/missing.keras", FAILURE,
                                        "{tmp}/missing.keras"),
    "evaluate/batch-size-0": row(EVALUATE + " --batch-size 0", USAGE, "--batch-size 0"),
    "evaluate/crop-pct-0": row(EVALUATE + " --crop-pct 0", USAGE, "--crop-pct 0"),
    "evaluate/image-size-not-patches": row(EVALUATE + " --image-size 30", USAGE, "--image-size 30"),
    "evaluate/unknown-precision": row(EVALUATE + " --precision float64", USAGE, "--precision", "float64"),
    "evaluate/classes-differ": row(EVALUATE + " --model {model}", FAILURE, "10 classes", "--data {digits}",
                                   reads="data model"),
    # --- the command itself ---
    "keras-cait/unknown-command": row("frobnicate", USAGE, "frobnicate"),
    "keras-cait/no-command": row("", USAGE, "required"),
}


def test_the_table_covers_every_subcommand_with_40_rows_or_more():
    commands = {name.split("/")[0] for name in ROWS}
    assert commands >= {"predict", "convert", "export", "attention", "demo", "train", "finetune", "evaluate"}
    assert len(ROWS) >= 40


def _image(path, size=(40, 50)):
    pixels = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture(scope="module")
def tiny_keras_model(tmp_path_factory):
    """A 10-class tiny CaiT saved as .keras (outside every row's folder)."""
    from keras_cait.models.architecture import build_cait
    from tests.conftest import TINY_CAIT, TINY_SIZE

    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=10).save(path)
    return str(path)


@pytest.fixture(scope="module")
def other_keras_models(tmp_path_factory):
    """{notcait}: a keras.applications MobileNet with its 2-class top; {dense}: a Dense model of
    8 numbers, each saved as .keras (outside every row's folder)."""
    import keras

    folder = tmp_path_factory.mktemp("other_models")
    keras.applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=2).save(folder / "mobilenet.keras")
    keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]).save(folder / "dense.keras")
    return {"notcait": str(folder / "mobilenet.keras"), "dense": str(folder / "dense.keras")}


def make_workspace(root):
    """The files the rows name: {image} {garbage}.jpg|.safetensors|.keras {afile} {folder}
    {pngfolder} {digits} (2 classes of 2 images) {lonely} (a class of 1 image) {oneclass} (1 class of
    2 images) {broken} (a text
    file named .jpg, a cut JPEG) {empty} (a class without images) {existing}/1
    {names} (3 class names, one a line)."""
    os.makedirs(root, exist_ok=True)
    paths = {"tmp": str(root)}
    paths["image"] = str(_image(os.path.join(root, "photo.png")))
    paths["garbage"] = os.path.join(root, "garbage")
    for suffix in (".jpg", ".safetensors", ".keras"):
        with open(paths["garbage"] + suffix, "wb") as file:
            file.write(np.random.default_rng(1).bytes(256))
    paths["afile"] = os.path.join(root, "afile")
    with open(paths["afile"], "w") as file:
        file.write("not a folder\n")
    paths["names"] = os.path.join(root, "three_names.txt")
    with open(paths["names"], "w") as file:
        file.write("cat\ndog\nbird\n")
    paths["repeated"] = os.path.join(root, "ten_names_one_twice.txt")
    with open(paths["repeated"], "w") as file:
        file.write("".join(f"class{i}\n" for i in range(9)) + "class3\n")
    for name in ("folder", "pngfolder.png", "existing/1", "empty/cat"):
        os.makedirs(os.path.join(root, name))
    paths.update(folder=os.path.join(root, "folder"), pngfolder=os.path.join(root, "pngfolder.png"),
                 existing=os.path.join(root, "existing"), empty=os.path.join(root, "empty"))
    for name, sizes in (("digits", (2, 2)), ("lonely", (2, 1)), ("broken", (2, 2)), ("oneclass", (2,))):
        paths[name] = os.path.join(root, name)
        for label, count in enumerate(sizes):
            os.makedirs(os.path.join(paths[name], str(label)))
            for index in range(count):
                _image(os.path.join(paths[name], str(label), f"{index}.png"), size=(32, 32))
    with open(os.path.join(paths["broken"], "0", "notes.jpg"), "w") as file:
        file.write("not an image\n")
    with open(os.path.join(paths["broken"], "1", "cut.jpg"), "wb") as file:
        file.write(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")  # a JPEG cut in its header
    return paths


def fill(text, paths):
    for name, path in paths.items():
        text = text.replace("{" + name + "}", path)
    return text


def expand(argv, paths):
    return [fill(word, paths) for word in argv.split()]


def tree(root):
    """Every path under `root`, with the size of files: what a row must leave as it found."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = None if os.path.isdir(path) else os.path.getsize(path)
    return found


@pytest.fixture
def guards(monkeypatch):
    """Fails a row that builds or loads a model, or reads data, unless the row says it may."""
    import keras

    import keras_cait.models.variants
    from keras_cait.training import run_models, sources

    def guard(reads):
        def refuse(what):
            def refused(*args, **kwargs):
                raise AssertionError(f"the row {what} before its mistake was reported")

            return refused

        if "model" not in reads:
            for module, name in ((keras_cait.models.variants, "build_cait"), (run_models, "build_cait"),
                                 (keras.models, "load_model")):
                monkeypatch.setattr(module, name, refuse(f"built or loaded a model ({name})"))
        if "data" not in reads:
            monkeypatch.setattr(sources, "source", refuse("read data"))

    return guard


def run_row(argv, capfd):
    """Runs `keras-cait ARGV` in this process; returns (status, standard error)."""
    capfd.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(argv)
    return ended.value.code, capfd.readouterr().err


def assert_contract(command, status, err, row, paths):
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line on stderr:\n{err}"
    line = err.rstrip("\n")
    prefix = f"keras-cait {command}: " if command != "keras-cait" else "keras-cait: "
    assert line.startswith(prefix), line
    assert status == row.status, f"exit status {status}, expected {row.status}: {line}"
    for name in row.names:
        assert fill(name, paths) in line, line


@pytest.mark.large
@pytest.mark.parametrize("name", list(ROWS))
def test_row(name, tmp_path, monkeypatch, capfd, guards, tiny_keras_model, other_keras_models, policy):
    """`policy` restores float32: rows that list data set the run's dtype policy first."""
    row = ROWS[name]
    paths = {**make_workspace(tmp_path / "row"), "model": tiny_keras_model, **other_keras_models}
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setenv("KERAS_CAIT_HUB_URL", "http://127.0.0.1:9")  # refuses connections
    monkeypatch.delenv("KERAS_CAIT_DEBUG", raising=False)
    guards(row.reads)
    before = tree(tmp_path / "row")

    status, err = run_row(expand(row.argv, paths), capfd)

    assert_contract(name.split("/")[0], status, err, row, paths)
    assert tree(tmp_path / "row") == before, "the row left files behind or changed them"


# === Debug, bugs, and the real console script ===


def test_debug_flag_and_environment_show_the_traceback_of_a_user_mistake(tmp_path, monkeypatch, capfd):
    missing = str(tmp_path / "missing.jpg")
    for argv, environment in (([missing, "--debug"], None), ([missing], "1")):
        if environment:
            monkeypatch.setenv("KERAS_CAIT_DEBUG", environment)
        status, err = run_row(["predict", *argv], capfd)
        assert status == FAILURE
        assert err.startswith("Traceback (most recent call last):")
        assert err.rstrip("\n").splitlines()[-1] == f"keras-cait predict: image {missing!r}: no such file; check the path."


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    """An error the commands do not expect is not the user's: it is not turned into a line."""
    from keras_cait.cli import commands

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(commands, "check_image_files", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["predict", str(tmp_path / "x.jpg")])


def test_an_interrupted_command_is_one_line(tmp_path, monkeypatch, capfd):
    from keras_cait.cli import commands

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(commands, "check_image_files", interrupted)
    status, err = run_row(["predict", str(tmp_path / "x.jpg")], capfd)
    assert status == FAILURE
    assert err == "keras-cait predict: interrupted; run the same command again (train and finetune " \
                  "resume from their last backup)\n"


def test_the_failure_is_a_system_exit_whose_text_is_the_line(tmp_path, capfd):
    """Scripts that call `main` see the line in the exception as on the terminal."""
    with pytest.raises(CommandFailed) as ended:
        main(["demo", "--epochs", "0"])
    assert ended.value.code == USAGE
    assert str(ended.value) == capfd.readouterr().err.rstrip("\n")


def _console(argv, cwd, env=None, timeout=300):
    """`python -m keras_cait.cli ARGV` as a user runs it: (status, stdout, stderr)."""
    return _python(["-m", "keras_cait.cli", *argv], cwd, env, timeout)


def _python(arguments, cwd, env=None, timeout=300):
    environment = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    done = subprocess.run([sys.executable, *arguments], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.large
def test_the_console_command_exits_with_the_status_and_the_line_alone(tmp_path):
    status, out, err = _console(["export", str(tmp_path / "serving" / "v1"), "--weights", "none"], tmp_path)
    assert (status, out) == (USAGE, "")
    assert err.count("\n") == 1 and err.startswith(f"keras-cait export: {tmp_path / 'serving' / 'v1'}: ")
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []


INTERRUPTED = "interrupted; run the same command again (train and finetune resume from their last backup)"


def _importing_tensorflow(pid):
    """Whether TensorFlow's library is mapped into process `pid`: it is importing Keras and TensorFlow."""
    with open(f"/proc/{pid}/maps") as maps:
        return "tensorflow" in maps.read()


@pytest.mark.large
@pytest.mark.parametrize("entry, after", [("script", 0.0), ("script", 1.0), ("script", 3.0), ("module", 0.5),
                                          ("script", "training")])
def test_ctrl_c_while_the_command_starts_is_the_interrupted_line(entry, after, tmp_path):
    """SIGINT `after` seconds once the process has begun loading TensorFlow (polled in /proc, so
    the signal never lands before Python runs keras_cait), or once the run has begun training
    (its run.json written): on the real console script (or `python -m keras_cait.cli`), wherever
    it lands (importing Keras and TensorFlow, importing the training modules, or in the run), the
    line alone, never a KeyboardInterrupt traceback."""
    import signal
    import time

    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc to see when the process has begun loading TensorFlow")
    paths = make_workspace(tmp_path / "row")
    command = ([os.path.join(os.path.dirname(sys.executable), "keras-cait")] if entry == "script"
               else [sys.executable, "-m", "keras_cait.cli"])
    argv = ["finetune", "--data", paths["digits"], "--output-dir", str(tmp_path / "run"), "--model", "XXS24",
            "--weights", "none", "--image-size", "32", "--verbose", "0", "--epochs", "1000"]
    environment = {**os.environ, "PYTHONPATH": REPOSITORY, "TF_CPP_MIN_LOG_LEVEL": "3"}
    environment.pop("KERAS_CAIT_DEBUG", None)
    process = subprocess.Popen([*command, *argv], env=environment, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = ((lambda: os.path.exists(tmp_path / "run" / "run.json")) if after == "training"
                   else (lambda: _importing_tensorflow(process.pid)))
        while process.poll() is None and not started():
            time.sleep(0.005)
        assert process.poll() is None, process.communicate()
        time.sleep(0 if after == "training" else after)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.rstrip("\n").splitlines()[-1] == f"keras-cait finetune: {INTERRUPTED}", err
    assert process.returncode == FAILURE, err


# === Rows whose mistake is a permission: run as a user other than root ===


def _other_user():
    """(uid, why not): this process's user when it is not root, else `nobody`."""
    if os.geteuid() != 0:
        return os.geteuid(), None
    try:
        return pwd.getpwnam("nobody").pw_uid, None
    except KeyError:
        return None, "the tests run as root and there is no user `nobody` to run permission rows as"


PERMISSION_ROWS = {
    "predict/read-only-cache": row("predict {image} --model cait_xxs24_224", FAILURE,
                                   "{locked}", "KERAS_HOME", "--weights"),
    "convert/output-in-a-read-only-folder": row("convert {checkpoint} {locked}/out.weights.h5 "
                                                "--model cait_xxs24_224", FAILURE, "--output {locked}/out.weights.h5",
                                                "permission denied"),
    "export/read-only-base-path": row("export {locked}/cait/1 --weights none", FAILURE, "{locked}/cait/1",
                                      "permission denied"),
    "attention/out-in-a-read-only-folder": row("attention {image} --weights none --out {locked}/maps.png",
                                               FAILURE, "--out {locked}/maps.png", "permission denied"),
    "demo/out-in-a-read-only-folder": row("demo --small --out {locked}/demo", FAILURE, "--out {locked}/demo",
                                          "permission denied"),
    "train/output-dir-in-a-read-only-folder": row("train --data {digits} --output-dir {locked}/run", FAILURE,
                                                  "--output-dir {locked}/run", "permission denied"),
    "finetune/output-dir-in-a-read-only-folder": row("finetune --data {digits} --output-dir {locked}/run",
                                                     FAILURE, "--output-dir {locked}/run", "permission denied"),
    "evaluate/unreadable-data": row("evaluate --data {unreadable}", FAILURE, "{unreadable}",
                                    "Permission denied"),
}


# The interpreter may live where only root can read (/root/.pyenv): the command's modules are
# imported first, then the process becomes the user for good, and `keras-cait` runs as that user.
AS_USER = """
import os, sys
from keras_cait.cli import commands, demo, runs
import keras_cait.inspection.attention, keras_cait.inspection.visualize, keras_cait.weights.download
from keras_cait.export import check_destination, export_saved_model  # keras_cait.export loads these on first use
uid, gid = int(sys.argv[1]), int(sys.argv[2])
if uid != os.geteuid():
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
commands.main(sys.argv[3:])
"""


@pytest.fixture(scope="module")
def other_user():
    uid, why = _other_user()
    if uid is None:
        pytest.skip(why)
    return uid


def compared(root):
    return {path: size for path, size in tree(root).items() if path.split(os.sep)[0] != "home"}


@pytest.mark.large
@pytest.mark.parametrize("name", list(PERMISSION_ROWS))
def test_permission_row(name, other_user):
    """As a user without the permission: the folder is refused before any model is built
    (export would otherwise trace the model for about 10 s first)."""
    row = PERMISSION_ROWS[name]
    root = tempfile.mkdtemp(prefix="keras-cait-permission-")  # in /tmp, which every user may enter
    try:
        paths = make_workspace(os.path.join(root, "row"))
        paths["checkpoint"] = paths["garbage"] + ".safetensors"
        paths["locked"] = os.path.join(root, "locked")  # the user may read it, not write in it
        paths["unreadable"] = os.path.join(root, "unreadable")
        os.makedirs(paths["locked"])
        shutil.copytree(paths["digits"], paths["unreadable"])
        for folder, folders, files in os.walk(os.path.join(root, "row")):
            os.chown(folder, other_user, -1)
            for file in files:
                os.chown(os.path.join(folder, file), other_user, -1)
        for path in (root, paths["locked"]):
            os.chmod(path, 0o755)
        os.chmod(paths["unreadable"], 0o700)
        if other_user == os.geteuid():  # not root: take the permissions away from ourselves
            os.chmod(paths["locked"], 0o555)
            os.chmod(paths["unreadable"], 0o000)
        with open(os.path.join(paths["locked"], "keras.json"), "w") as file:
            file.write("{}")  # else Keras writes it into KERAS_HOME on import, as root
        home = os.path.join(root, "home")  # for matplotlib's own files, not compared
        os.makedirs(home)
        os.chown(home, other_user, -1)
        before = compared(root) if other_user != os.geteuid() else None
        env = {"KERAS_HOME": paths["locked"], "KERAS_CAIT_HUB_URL": "http://127.0.0.1:9",
               "HOME": home, "MPLCONFIGDIR": home}
        user = pwd.getpwuid(other_user)
        status, out, err = _python(["-c", AS_USER, str(user.pw_uid), str(user.pw_gid),
                                    *expand(row.argv, paths)], paths["tmp"], env)
        assert_contract(name.split("/")[0], status, err, row, paths)
        if before is not None:
            assert compared(root) == before, "the row left files behind or changed them"
    finally:
        os.chmod(root, 0o700)
        for path in (os.path.join(root, "locked"), os.path.join(root, "unreadable")):
            if os.path.isdir(path):
                os.chmod(path, 0o700)
        shutil.rmtree(root, ignore_errors=True)


# === Errors while writing name the user's path, not the hidden one written first ===


@pytest.mark.parametrize("kind", ["os", "tensorflow"])
def test_an_error_while_exporting_names_the_version_folder_not_the_hidden_one(kind, tmp_path, monkeypatch, capfd):
    import tensorflow as tf

    from keras_cait import export as exporters
    from keras_cait.cli import commands
    from keras_cait.models.architecture import build_cait
    from tests.conftest import TINY_CAIT

    version = str(tmp_path / "serving" / "1")
    hidden = str(tmp_path / "serving" / ".1.partial-4242-abcdefgh" / "1" / "variables")

    def export_saved_model(*args, **kwargs):
        if kind == "os":
            raise PermissionError(13, "Permission denied", hidden)
        raise tf.errors.PermissionDeniedError(None, None, f"{hidden}; Permission denied")

    monkeypatch.setattr(commands, "_loaded", lambda *args, **kwargs: build_cait(**TINY_CAIT, input_shape=(32, 32, 3)))
    monkeypatch.setattr(exporters, "export_saved_model", export_saved_model)
    status, err = run_row(["export", version, "--weights", "none"], capfd)
    assert status == FAILURE and err.count("\n") == 1
    assert err.startswith(f"keras-cait export: could not write {version}: ")
    assert ".partial" not in err and "permission" in err.lower() and "choose" in err
