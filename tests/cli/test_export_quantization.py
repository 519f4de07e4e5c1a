"""keras-cait export --quantization and OpenVINO outputs: what each format takes, refused before any work."""

import os
import re

import pytest

from keras_cait.cli import main
from keras_cait.export import openvino as exporter


@pytest.mark.parametrize(
    "output, quantization, message",
    [
        ("cait.tflite", "int8", r"LiteRT \(a .tflite file\) takes dynamic_int8;.*does not convert to LiteRT"),
        ("cait.xml", "int4", r"OpenVINO \(a .xml file\) takes int8 or int8_weights;.*export to a SavedModel "
                             r"version folder"),
        ("cait.onnx", "int8_weights", r"ONNX \(a .onnx file\) takes int8;.*export to a .xml file, e.g. cait.xml\.$"),
        ("cait.onnx", "dynamic_int8", r"ONNX \(a .onnx file\) takes int8;.*export to a .tflite file"),
        ("serving/cait/1", "dynamic_int8", r"SavedModel \(a version folder\) takes int8, int4 or float8;.*"
                                           r"export to a .tflite file, e.g. cait.tflite\.$"),
    ],
)
def test_unsupported_quantization_is_refused_before_the_model_is_built(output, quantization, message, tmp_path):
    # --weights imagenet would download the weights, if the check came after building the model.
    with pytest.raises(SystemExit, match=f"keras-cait export: --quantization {quantization}: .*{message}"):
        main(["export", str(tmp_path / output), "--quantization", quantization, "--model", "cait_s24_224"])
    assert os.listdir(tmp_path) == []


def test_a_saved_model_with_dynamic_int8_is_one_line_saying_what_each_format_takes(tmp_path, capfd):
    """Not the old "must be one of (None, 'int8'), ..., or 'int4' or 'float8'", which contradicted itself."""
    with pytest.raises(SystemExit) as ended:
        main(["export", str(tmp_path / "serving" / "1"), "--quantization", "dynamic_int8"])
    assert ended.value.code == 2
    assert capfd.readouterr().err == (
        "keras-cait export: --quantization dynamic_int8: SavedModel (a version folder) takes int8, int4 or "
        "float8; ONNX (a .onnx file) int8; LiteRT (a .tflite file) dynamic_int8; OpenVINO (a .xml file) int8 or "
        "int8_weights. For dynamic_int8, export to a .tflite file, e.g. cait.tflite.\n")


@pytest.mark.parametrize("suffix, name", [(".onnx", "ONNX"), (".tflite", "LiteRT"), (".xml", "OpenVINO")])
def test_bfloat16_to_a_file_names_the_formats_that_take_it(suffix, name, tmp_path, capfd):
    with pytest.raises(SystemExit) as ended:
        main(["export", str(tmp_path / f"cait{suffix}"), "--compute-dtype", "bfloat16"])
    line = capfd.readouterr().err
    assert ended.value.code == 2 and line.count("\n") == 1
    assert line.startswith(f"keras-cait export: --compute-dtype bfloat16: {name} (a {suffix} file) computes in "
                           "float32; SavedModel (a version folder) float32 or bfloat16;")
    assert line.endswith("For bfloat16, export to a SavedModel version folder, e.g. serving/cait/1.\n")
    assert os.listdir(tmp_path) == []


# === NNCF's int8 to OpenVINO: --calibration-data and --calibration-size ===


@pytest.mark.parametrize("flags, status, line", [
    (["--quantization", "int8"], 2,
     "--quantization int8: OpenVINO (a .xml file) calibrates int8 on images like those the model will classify; "
     "give --calibration-data FOLDER (a few hundred of them, e.g. its validation folder), or --quantization "
     "int8_weights, which needs none"),
    (["--quantization", "int8", "--calibration-data", "{empty}"], 1,
     "--calibration-data {empty}: no images in it or its subfolders; give a folder of JPEG, PNG, GIF, BMP or WebP "
     "files (.jpg, .jpeg, .png, .gif, .bmp, .webp) like those the model will classify, e.g. its validation folder"),
    (["--quantization", "int8", "--calibration-data", "{empty}/missing"], 1,
     "--calibration-data {empty}/missing: no such folder; give a folder of images like those the model will "
     "classify, e.g. its validation folder"),
    (["--quantization", "int8_weights", "--calibration-data", "{empty}"], 2,
     "--calibration-data {empty}: --quantization int8_weights to OpenVINO (a .xml file) takes no calibration "
     "images; only OpenVINO (a .xml file) with --quantization int8 does; leave it out, or export that"),
    (["--calibration-size", "5"], 2,
     "--calibration-size 5 applies with --calibration-data; give that too, or leave --calibration-size out."),
    (["--quantization", "int8", "--calibration-data", "{empty}", "--calibration-size", "0"], 2,
     "--calibration-size 0: must be at least 1, e.g. --calibration-size 300."),
])
def test_calibration_flags_are_refused_in_one_line_before_the_model_is_built(flags, status, line, tmp_path, capfd):
    empty = tmp_path / "empty"
    (empty / "cats").mkdir(parents=True)
    (empty / "cats" / "notes.txt").write_text("no image")
    flags = [flag.format(empty=empty) for flag in flags]
    # --model cait_s24_224 would download its weights, if the check came after building the model.
    with pytest.raises(SystemExit) as ended:
        main(["export", str(tmp_path / "out" / "cait.xml"), "--model", "cait_s24_224", *flags])
    assert ended.value.code == status
    assert capfd.readouterr().err == f"keras-cait export: {line.format(empty=empty)}\n"
    assert not (tmp_path / "out").exists()


def test_calibration_data_for_another_format_is_refused_naming_the_one_that_takes_it(tmp_path, capfd):
    with pytest.raises(SystemExit) as ended:
        main(["export", str(tmp_path / "cait.onnx"), "--quantization", "int8", "--calibration-data", str(tmp_path)])
    assert ended.value.code == 2
    assert capfd.readouterr().err == (
        f"keras-cait export: --calibration-data {tmp_path}: --quantization int8 to ONNX (a .onnx file) takes no "
        "calibration images; only OpenVINO (a .xml file) with --quantization int8 does; leave it out, or export "
        "that\n")
    assert os.listdir(tmp_path) == []


@pytest.mark.large
def test_int8_export_says_what_it_quantised_and_how_long_calibration_took(tmp_path, capfd):
    import numpy as np
    from PIL import Image

    from keras_cait.models.architecture import build_cait
    from tests.conftest import TINY_CAIT

    build_cait(**TINY_CAIT, input_shape=(32, 32, 3), classes=3).save(tmp_path / "model.keras")
    rng = np.random.RandomState(0)
    for index in range(6):  # photos of another size: the evaluation transform crops them to 32x32
        (tmp_path / "photos" / f"class{index % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.randint(0, 256, (48, 40, 3), dtype=np.uint8)).save(
            tmp_path / "photos" / f"class{index % 3}" / f"{index}.jpg")
    output = tmp_path / "out" / "cait.xml"
    main(["export", str(output), "--model", str(tmp_path / "model.keras"), "--quantization", "int8",
          "--calibration-data", str(tmp_path / "photos"), "--calibration-size", "4"])
    lines = capfd.readouterr().out.splitlines()
    assert lines[-1] == f"wrote {output}"
    note = f". {exporter.int8_note()}" if exporter.int8_note() else ""  # what was measured on such CPUs
    assert re.fullmatch(r"int8: \d+ matmuls and convolutions take int8 inputs \(NNCF, transformer preset\), the 4 "
                        r"talking-heads mixes, the \d+ attention matmuls kept float; calibrated on 4 images in "
                        r"\d+\.\d s" + re.escape(note), lines[-2]), lines[-2]
    assert sorted(os.listdir(output.parent)) == ["cait.bin", "cait.xml"]
    main(["export", str(tmp_path / "out" / "weights.xml"), "--model", str(tmp_path / "model.keras"),
          "--quantization", "int8_weights"])
    # 2 x 4 self-attention and 2 x 5 class-attention linears, the head, the patch embedding (the 4 head
    # mixes' kernels, computed at run time, stay float)
    assert capfd.readouterr().out.splitlines()[-2:] == [
        "int8_weights: 20 weight tensors stored as int8 (NNCF, no calibration)", f"wrote {tmp_path / 'out' / 'weights.xml'}"]


def test_top_k_is_refused_for_openvino(tmp_path):
    with pytest.raises(SystemExit, match="--top-k applies to SavedModels only"):
        main(["export", str(tmp_path / "cait.xml"), "--top-k", "3"])


# === The formats table: the dispatch and the help of keras-cait export read it ===


@pytest.mark.parametrize("output, exporter, options", [
    ("serving/cait/1", "export_saved_model", {"quantization": "int4", "overwrite": False, "top_k": 5,
                                              "compute_dtype": "float32", "jit_compile": False}),
    ("serving/cait/2", "export_saved_model", {"quantization": None, "overwrite": False, "top_k": 5,
                                              "compute_dtype": "bfloat16", "jit_compile": True}),
    ("cait.onnx", "export_onnx", {"quantization": "int8", "overwrite": False}),
    ("cait.tflite", "export_litert", {"quantization": "dynamic_int8", "overwrite": False}),
    ("cait.xml", "export_openvino", {"quantization": None, "overwrite": True}),
])
def test_each_output_goes_to_its_exporter(output, exporter, options, tmp_path, monkeypatch, capsys):
    from keras_cait import export as exporters
    from keras_cait.cli import commands
    from keras_cait.export import formats
    from keras_cait.models.architecture import build_cait
    from tests.conftest import TINY_CAIT

    model = build_cait(**TINY_CAIT, input_shape=(32, 32, 3))
    monkeypatch.setattr(commands, "_loaded", lambda *args, **kwargs: model)
    called = []
    for row in formats.FORMATS:
        monkeypatch.setattr(exporters, row.exporter,
                            lambda *args, name=row.exporter, **kwargs: called.append((name, args, kwargs)))
    path = str(tmp_path / output)
    flags = [f"--quantization={options['quantization']}"] if options["quantization"] else []
    flags += [f"--compute-dtype={options['compute_dtype']}"] if options.get("compute_dtype", "float32") != "float32" else []
    flags += ["--jit"] if options.get("jit_compile") else []
    main(["export", path, "--weights", "none", *flags, *(["--overwrite"] if options["overwrite"] else [])])
    assert called == [(exporter, (model, path), options)]
    assert capsys.readouterr().out == f"wrote {path}\n"


def test_the_help_lists_every_format_and_mode_of_the_table(capsys):
    from keras_cait.export import formats

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--quantization {int8,int4,float8,dynamic_int8,int8_weights}" in text
    assert ("or a .onnx (ONNX), .tflite (LiteRT) or .xml (OpenVINO) file") in text
    assert ("int8: Keras int8 (SavedModel, ONNX), NNCF int8 weights and activations, calibrated (OpenVINO); int4: "
            "Keras int4 (SavedModel); float8: Keras float8 (SavedModel); dynamic_int8: TFLite int8 weights (LiteRT); "
            "int8_weights: NNCF int8 weights, no calibration (OpenVINO)") in text
    assert "--calibration-data FOLDER OpenVINO int8 only: images like those the model will classify" in text
    for row in formats.file_formats():
        assert f"{row.suffix} ({row.name})" in text


def test_top_k_is_refused_for_every_file_format_naming_them(tmp_path):
    for suffix in (".onnx", ".tflite", ".xml"):
        with pytest.raises(SystemExit, match=r"--top-k applies to SavedModels only \(ONNX, LiteRT and "
                                             r"OpenVINO output scores\); leave it out, or export a "
                                             r"SavedModel version folder\."):
            main(["export", str(tmp_path / f"cait{suffix}"), "--top-k", "3"])
    assert os.listdir(tmp_path) == []


def test_precision_is_a_dtype_policy_and_export_takes_a_compute_dtype(tmp_path, capsys):
    """`--precision` is a Keras dtype policy wherever it appears (train, finetune, evaluate); the
    dtype the exported graph computes in is export's `--compute-dtype`, export_saved_model's
    `compute_dtype`."""
    from keras_cait.cli import runs

    for parser in (runs.train_parser(), runs.finetune_parser()):
        assert "--precision {auto,float32,mixed_float16,mixed_bfloat16}" in parser.format_help()
    assert "--precision {float32,mixed_float16,mixed_bfloat16}" in runs.evaluate_parser().format_help()
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path / "serving" / "1"), "--precision", "bfloat16",
              "--model", str(tmp_path / "missing.keras")])
    assert "unrecognized arguments: --precision bfloat16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "--compute-dtype {float32,bfloat16}" in capsys.readouterr().out
    assert not (tmp_path / "serving").exists()
