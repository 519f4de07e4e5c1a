"""keras_cait/export/core.py and the exporters' shared refusals: a destination no format writes,
an optional extra that is not installed. Each is one error naming the argument, or the extra to
install, before anything is traced or written."""

import importlib.metadata
import os
import re
import sys

import keras
import numpy as np
import pytest

from keras_cait.errors import ArgumentError, ExtraMissing
from keras_cait.export import FORMATS, check_destination
from keras_cait.export.formats import file_formats
from tests.export.helpers import small_model


def _modules_of_extra(extra):
    """The top-level modules of the distributions that `pip install "keras-cait[extra]"` installs
    (those of them installed here), read from keras-cait's own metadata."""
    distributions = set()
    for requirement in importlib.metadata.requires("keras-cait") or ():
        name, _, marker = requirement.partition(";")
        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            distributions.add(re.split(r"[<>=!~\[ ]", name.strip(), maxsplit=1)[0].lower().replace("_", "-"))
    modules = importlib.metadata.packages_distributions()
    return sorted(module for module, owners in modules.items()
                  if module.replace("_", "-").lower() in distributions
                  and any(owner.lower().replace("_", "-") in distributions for owner in owners))


@pytest.mark.parametrize("row", [row for row in FORMATS if row.extra], ids=lambda row: row.name)
def test_an_export_without_its_extra_names_the_pip_install(row, model, tmp_path, monkeypatch):
    """Read from the formats table's `extra` column: every format that needs an extra says which."""
    modules = _modules_of_extra(row.extra)
    assert modules, f'pip install "keras-cait[{row.extra}]" installs no module this test can hide'
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails as if not installed
    path = tmp_path / f"cait{row.suffix}"
    with pytest.raises(ExtraMissing) as raised:
        row.load()(model, path)
    assert isinstance(raised.value, ImportError) and raised.value.extra == row.extra
    assert str(raised.value).startswith(f"{row.exporter} needs ")
    assert str(raised.value).endswith(f'; pip install "keras-cait[{row.extra}]"')
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("row", FORMATS, ids=lambda row: row.name)
def test_every_exporter_given_a_path_for_its_model_says_to_load_it_and_writes_nothing(row, tmp_path):
    """`keras-cait export --model final.keras` takes a path; the Python exporters take the model."""
    path = tmp_path / ("cait/1" if not row.suffix else f"cait{row.suffix}")
    with pytest.raises(ArgumentError) as raised:
        row.load()("runs/x/final.keras", path)
    assert str(raised.value) == (f"model='runs/x/final.keras': {row.exporter} takes a Keras model, not a name or a "
                                 "path; load it first: keras_cait.models.load_classifier('runs/x/final.keras')")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("row", FORMATS, ids=lambda row: row.name)
def test_overwrite_given_a_str_from_a_config_is_refused_and_the_export_kept(row, model, tmp_path):
    """`overwrite='no'` is truthy: it replaced the export that it meant to keep."""
    path = tmp_path / ("cait/1" if not row.suffix else f"cait{row.suffix}")
    if row.suffix:
        path.write_bytes(b"kept")
    else:
        path.mkdir(parents=True)
    with pytest.raises(ArgumentError) as raised:
        row.load()(model, path, overwrite="no")
    assert str(raised.value) == "overwrite='no': must be True (replace an existing export) or False (refuse it), not str"
    assert raised.value.argument == "overwrite"
    assert path.is_dir() if not row.suffix else path.read_bytes() == b"kept"
    with pytest.raises(ArgumentError, match="^overwrite='False': must be True"):
        check_destination(path, overwrite="False")


@pytest.mark.parametrize("name", ["model.pt", "cait.h5", "weights.safetensors", "serving/cait.pth"])
def test_a_destination_whose_suffix_no_format_writes_is_refused_naming_the_suffixes(name, tmp_path):
    """Not taken for a TF Serving version folder (whose advice used to be all it got)."""
    path = str(tmp_path / name)
    with pytest.raises(ArgumentError) as raised:
        check_destination(path)
    error = raised.value
    assert (error.argument, error.value, error.usage) == ("path", path, True)
    suffix = os.path.splitext(name)[1]
    assert str(error).startswith(f"path={path!r}: no export format writes a {suffix} file; give a path ending in ")
    for row in file_formats():
        assert f"{row.suffix} ({row.name})" in str(error)
    assert "version folder" in str(error) and "TF Serving loads" not in str(error)


@pytest.mark.parametrize("row", [row for row in FORMATS if row.companions], ids=lambda row: row.name)
def test_check_destination_refuses_a_file_written_beside_the_destination_that_exists(row, tmp_path):
    """`cait.xml` with `cait.bin` there passed, and the export refused it after the model was built."""
    path = tmp_path / f"cait{row.suffix}"
    for companion in row.companion_paths(path):
        with open(companion, "w") as file:
            file.write("kept")
        with pytest.raises(FileExistsError, match=f"^{re.escape(repr(companion))} exists; pass overwrite=True"):
            check_destination(path)
        assert check_destination(path, overwrite=True) is None
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(c) for c in row.companion_paths(path))


@pytest.mark.parametrize("name", ["serving/cait/1", "serving/cait.v2/3"])
def test_a_version_folder_is_still_a_destination(name, tmp_path):
    assert check_destination(tmp_path / name) is None


def test_the_exporters_import_no_training_module():
    """The model surgery an export needs (merge_lora, with_dtype_policy) lives with the models:
    exporting loads nothing of `keras_cait.training` (nor its data pipeline)."""
    from tests.test_imports import loaded_modules

    modules = loaded_modules(
        "from keras_cait.export import export_saved_model, export_onnx\n"
        "import keras_cait.export as export\n"
        "[getattr(export, name) for name in (*export.EXPORTERS, 'check_destination', 'check_quantization')]\n"
        "import keras_cait.export.core, keras_cait.export.inference_graph", "tensorflow")
    assert {"keras_cait.export.core", "keras_cait.export.saved_model"} <= modules
    assert sorted(name for name in modules if name.startswith("keras_cait.training")) == []



@pytest.mark.parametrize("given, example, writer", [
    ("out/model.onnx", "out/1", "export_onnx"),
    ("out/model.keras", "out/1", "model.save"),
    ("out/sm/0", "out/sm/1", None),
    ("out/sm/007", "out/sm/7", None),
    ("out/serving", "out/serving/1", None),
])
def test_a_saved_model_path_that_is_no_version_folder_gets_the_nearest_one_and_the_file_s_writer(given, example,
                                                                                                 writer):
    from keras_cait.export.core import check_version_folder

    with pytest.raises(ArgumentError) as raised:
        check_version_folder(given, False)
    assert str(raised.value).endswith(f"; e.g. {example!r}" + (f"; a {os.path.splitext(given)[1]} file is {writer}'s"
                                                                  if writer else ""))


@pytest.fixture(scope="module")
def quantized_model():
    """A small CaiT after `model.quantize("int8")` on its Dense layers, as a user quantises one."""
    model = small_model()
    model.quantize("int8", filters=lambda layer: isinstance(layer, keras.layers.Dense))
    return model


@pytest.mark.parametrize("row", FORMATS, ids=lambda row: row.name)
def test_a_model_quantised_by_keras_is_refused_where_its_export_cannot_take_it(row, quantized_model, tmp_path):
    """OpenVINO's converter computed such a model wrongly (top-1 as chance, no error), TFLite's
    failed with MLIR dumps, and asking any format to quantise it again failed deep in Keras."""
    path = tmp_path / "out" / ("cait/1" if not row.suffix else f"cait{row.suffix}")
    if row.quantized_model:
        with pytest.raises(ArgumentError) as raised:
            row.load()(quantized_model, path)
        takers = " or ".join(each.name for each in FORMATS if not each.quantized_model)
        assert str(raised.value) == (
            f"model=<{quantized_model.name}>: quantised by Keras (int8): {row.quantized_model}; export the float "
            f"model (with quantization=... for a smaller file), or this one to {takers}")
    mode = next(mode for mode in row.quantizations if mode is not None)
    with pytest.raises(ArgumentError) as raised:
        row.load()(quantized_model, path, quantization=mode, **({"calibration": tmp_path} if mode in row.calibrated
                                                                  else {}))
    assert str(raised.value) == (f"quantization={mode!r}: the model is quantised already (int8, by model.quantize); "
                                 "give the float model to quantise it, or quantization=None to export this one as it is")
    assert not (tmp_path / "out").exists()


def test_onnx_exports_a_model_quantised_by_keras_as_it_is(quantized_model, images, tmp_path):
    import onnxruntime

    from keras_cait.export import export_onnx

    export_onnx(quantized_model, tmp_path / "cait.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "cait.onnx"))
    np.testing.assert_allclose(session.run(None, {"images": images})[0], quantized_model.predict(images, verbose=0),
                               atol=2e-4)


@pytest.mark.parametrize("row", FORMATS, ids=lambda row: row.name)
def test_a_destination_of_the_other_kind_is_refused_and_kept_even_with_overwrite(row, model, tmp_path):
    """`overwrite=True` swapped a folder named `precious.onnx/` (and what it held) for the file."""
    path = tmp_path / ("cait/1" if not row.suffix else f"cait{row.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if row.suffix:
        path.mkdir()
        (path / "notes.txt").write_text("kept")
        there, written = "a folder", "a file"
    else:
        path.write_text("kept")
        there, written = "a file", "a version folder"
    with pytest.raises(ArgumentError) as raised:
        row.load()(model, path, overwrite=True)
    assert str(raised.value) == (f"path={str(path)!r}: is {there}, where the export writes {written}; choose another "
                                 "path, or move that one away")
    assert (path / "notes.txt" if row.suffix else path).read_text() == "kept"


@pytest.mark.parametrize("row", FORMATS, ids=lambda row: row.name)
def test_a_destination_inside_a_file_is_refused_before_anything_is_traced(row, model, tmp_path, monkeypatch):
    (tmp_path / "notes").write_text("kept")
    path = tmp_path / "notes" / ("cait/1" if not row.suffix else f"cait{row.suffix}")
    row.load()  # its module, whose inference_form is replaced
    monkeypatch.setattr(f"{row.module}.inference_form", lambda *args, **kwargs: pytest.fail("traced"))
    with pytest.raises(ArgumentError) as raised:
        row.load()(model, path)
    assert str(raised.value) == (f"path={str(path)!r}: is inside the file {tmp_path / 'notes'}, not a folder; "
                                 "choose another folder")
    assert (tmp_path / "notes").read_text() == "kept"


@pytest.mark.parametrize("row", FORMATS, ids=lambda row: row.name)
def test_a_model_with_no_inputs_yet_is_refused_naming_it(row, tmp_path):
    """A Sequential never called on data failed with Keras' bare AttributeError."""
    unbuilt = keras.Sequential([keras.layers.Dense(3)], name="unbuilt")
    with pytest.raises(ArgumentError) as raised:
        row.load()(unbuilt, tmp_path / ("cait/1" if not row.suffix else f"cait{row.suffix}"))
    assert str(raised.value) == (f"model=<unbuilt>: {row.exporter} takes a built model; this Sequential has no inputs "
                                 "yet; give it a keras.Input(shape=(224, 224, 3)) first, or call it on images once")
    assert os.listdir(tmp_path) == []


def test_a_cait_without_its_head_is_no_classifier_to_serve(tmp_path):
    """It said "the model has 32 classes and no names": the width of the class token's features."""
    from keras_cait.export import export_saved_model

    headless = small_model(include_top=False, pooling="token")
    with pytest.raises(ArgumentError) as raised:
        export_saved_model(headless, tmp_path / "cait" / "1")
    assert str(raised.value).startswith(f"model=<{headless.name}>: outputs (None, {headless.outputs[0].shape[-1]}), "
                                        "features of a CaiT without a head, not class scores; give a classifier: "
                                        "a CaiT built with include_top=True")
    assert os.listdir(tmp_path) == []
