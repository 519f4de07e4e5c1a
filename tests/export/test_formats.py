"""keras_cait.export.formats: the one table of export formats, what reads it, and docs/export.md's copy."""

import pathlib
import re

import keras
import pytest

import keras_cait
from keras_cait import export
from keras_cait.export import check_destination, formats
from keras_cait.export.core import check_quantization

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "export.md"

# Written out here, not read from the table: what each destination is and takes.
EXPECTED = {
    "serving/cait/1": ("SavedModel", "export_saved_model", {None, "int8", "int4", "float8"}),
    "cait.onnx": ("ONNX", "export_onnx", {None, "int8"}),
    "cait.tflite": ("LiteRT", "export_litert", {None, "dynamic_int8"}),
    "cait.xml": ("OpenVINO", "export_openvino", {None, "int8", "int8_weights"}),
}
MODES = [None, "int8", "int4", "float8", "dynamic_int8", "int8_weights", "int2", "INT8", ""]


def doc_block(name):
    text = DOC.read_text()
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert found, f"docs/export.md has no {name} block"
    return found.group(1)


def test_the_doc_table_is_the_code_table():
    """docs/export.md's formats table has the code's rows, cell for cell."""
    assert doc_block("export_formats") == formats.markdown_table(), (
        "docs/export.md's formats table differs from keras_cait/export/formats.py; paste in "
        "`python -c 'from keras_cait.export.formats import markdown_table; print(markdown_table())'`"
    )


def test_the_doc_table_has_a_row_per_format_with_its_cells():
    rows = [line.split(" | ") for line in doc_block("export_formats").splitlines()[2:]]
    assert [cells[0].strip("| ") for cells in rows] == [row.name for row in formats.FORMATS]
    for cells, row in zip(rows, formats.FORMATS):
        assert cells[1] == (f"`*{row.suffix}`" if row.suffix else "any other path: `MODEL_BASE_PATH/<n>`")
        assert cells[2] == f"`{row.exporter}`"
        assert re.findall(r'`"(\w+)"`', cells[3]) == [mode for mode in row.quantizations if mode]


def test_the_int8_table_of_the_doc_says_which_formats_take_int8():
    text = DOC.read_text()
    table = text[text.index("| export | int8 | why |"):].split("\n\n")[0].splitlines()[2:]
    said = {line.split(" | ")[0].strip("| "): line.split(" | ")[1].startswith("yes") for line in table}
    assert said == {row.name: "int8" in row.quantizations for row in formats.FORMATS}


@pytest.mark.parametrize("path", list(EXPECTED))
def test_each_destination_is_its_format_and_takes_exactly_its_modes(path):
    name, exporter, takes = EXPECTED[path]
    row = formats.format_of(path)
    assert (row.name, row.exporter) == (name, exporter)
    taken = set()
    for mode in MODES:
        try:
            check_quantization(path, mode)
            taken.add(mode)
        except ValueError as error:
            assert str(error).startswith(f"quantization={mode!r}: ")
    assert taken == takes


def test_the_table_has_these_formats_in_this_order():
    assert [(row.name, row.suffix) for row in formats.FORMATS] == [
        ("SavedModel", None), ("ONNX", ".onnx"), ("LiteRT", ".tflite"), ("OpenVINO", ".xml")]
    assert formats.quantization_modes() == ["int8", "int4", "float8", "dynamic_int8", "int8_weights"]
    assert set(formats.quantization_modes()) <= set(formats.QUANTIZATION_MODES)


LISTING = {
    "SavedModel": "SavedModel (a version folder) {takes}int8, int4 or float8",
    "ONNX": "ONNX (a .onnx file) {takes}int8",
    "LiteRT": "LiteRT (a .tflite file) {takes}dynamic_int8",
    "OpenVINO": "OpenVINO (a .xml file) {takes}int8 or int8_weights",
}


def listing(first):
    """What each format takes, `first`'s row first, as a refusal lists them."""
    rows = [first] + [name for name in LISTING if name != first]
    return "; ".join(LISTING[name].format(takes="takes " if name == first else "") for name in rows)


@pytest.mark.parametrize(
    "path, mode, line",
    [
        ("serving/cait/1", "dynamic_int8", f"quantization='dynamic_int8': {listing('SavedModel')}. For "
                                           "dynamic_int8, export to a .tflite file, e.g. cait.tflite."),
        ("cait.onnx", "int4", f"quantization='int4': {listing('ONNX')}. tf2onnx unpacks int4 kernels to "
                              "float32, no smaller than float. For int4, export to a SavedModel version folder, "
                              "e.g. serving/cait/1."),
        ("cait.tflite", "int8", f"quantization='int8': {listing('LiteRT')}. Keras' int8 model does not convert "
                                "to LiteRT (TFLite's fully_connected takes no int8 activations); dynamic_int8 is "
                                "TFLite's own int8 weights. For int8, export to a SavedModel version folder, a "
                                ".onnx file or a .xml file, e.g. serving/cait/1, cait.onnx or cait.xml."),
        ("cait.tflite", "float8", f"quantization='float8': {listing('LiteRT')}. For float8, export to a "
                                  "SavedModel version folder, e.g. serving/cait/1."),
        ("cait.xml", "int4", f"quantization='int4': {listing('OpenVINO')}. OpenVINO's int8 is NNCF's (int8 "
                             "calibrated, int8_weights data-free); Keras' int4 and float8 models do not convert to "
                             "OpenVINO correctly. For int4, export to a SavedModel version folder, e.g. serving/cait/1."),
        ("cait.onnx", "int8_weights", f"quantization='int8_weights': {listing('ONNX')}. For int8_weights, export "
                                      "to a .xml file, e.g. cait.xml."),
        ("cait.onnx", "int2", f"quantization='int2': {listing('ONNX')}. No format takes int2; give one of those, "
                              "or leave quantization out."),
    ],
)
def test_each_refusal_is_its_line(path, mode, line, tmp_path):
    with pytest.raises(ValueError) as refused:
        check_destination(tmp_path / path, quantization=mode)
    assert str(refused.value) == line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", formats.quantization_modes())
def test_every_refusal_says_what_each_format_takes_and_where_the_mode_goes(mode):
    """From the table: a mode is refused naming every format's modes, and the destinations that take it."""
    takers = [row for row in formats.FORMATS if mode in row.quantizations]
    for row in formats.FORMATS:
        refused = row.refused(mode)
        if row in takers:
            assert refused is None
            continue
        line = str(refused)
        for other in formats.FORMATS:
            assert f"{other.name} (a {f'{other.suffix} file' if other.suffix else 'version folder'})" in line
        assert f"For {mode}, export to {formats.listed([taker.destination for taker in takers], 'or')}, e.g. " in line


@pytest.mark.parametrize("path, line", [
    ("cait.onnx", "compute_dtype='bfloat16': ONNX (a .onnx file) computes in float32; SavedModel (a version "
                  "folder) float32 or bfloat16; LiteRT (a .tflite file) float32; OpenVINO (a .xml file) float32. "
                  "For bfloat16, export to a SavedModel version folder, e.g. serving/cait/1."),
    ("serving/cait/1", None),
])
def test_a_compute_dtype_is_refused_naming_the_formats_that_take_it(path, line):
    refused = formats.format_of(path).refused_compute_dtype("bfloat16")
    assert (refused if line is None else str(refused)) == line
    assert formats.format_of(path).refused_compute_dtype("float32") is None
    assert formats.compute_dtypes() == ["float32", "bfloat16"]


def test_check_destination_checks_each_file_by_its_suffix(tmp_path):
    for row in formats.file_formats():
        (tmp_path / f"cait{row.suffix}").write_bytes(b"old")
        with pytest.raises(FileExistsError, match="overwrite=True"):
            check_destination(tmp_path / f"cait{row.suffix}")
        assert check_destination(tmp_path / f"cait{row.suffix}", overwrite=True) is None
    with pytest.raises(ValueError, match="TF Serving loads numbered version folders"):
        check_destination(tmp_path / "cait.onnx" / "latest")  # no suffix of the table: a version folder
    with pytest.raises(ValueError, match=r"no export format writes a \.d file"):
        check_destination(tmp_path / "cait.onnx.d")  # a suffix no format writes


@pytest.mark.parametrize("row", formats.FORMATS, ids=lambda row: row.name)
def test_each_exporter_is_its_module_s_and_the_package_s(row):
    function = getattr(export, row.exporter)
    assert function.__module__ == row.module == f"keras_cait.export.{row.exporter.removeprefix('export_')}"
    assert getattr(keras_cait, row.exporter) is function
    assert row.exporter in export.__all__ and row.exporter in dir(export)
    if row.suffix:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        with pytest.raises(ValueError, match=rf"must end in \{row.suffix}, e.g. cait\{row.suffix}"):
            function(model, "cait.wrong")


def test_a_name_that_is_no_exporter_is_no_attribute():
    with pytest.raises(AttributeError, match="export_keras"):
        keras_cait.export_keras
    with pytest.raises(AttributeError, match="nothing"):
        export.nothing
