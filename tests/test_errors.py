"""keras_cait.errors: an error is data (the argument, its value, the problem, what is allowed), one
line in Python and in any caller's spelling; a missing extra named with its pip install. The errors
of the models' own arguments are tested with them (tests/models/test_variants.py, test_architecture.py)."""

import numpy as np
import pytest


# === keras_cait.errors: an error is data (the argument, its value, the problem, what is allowed) ===


def test_an_argument_error_is_one_line_of_its_fields_in_python():
    from keras_cait.errors import ArgumentError, Named

    error = ArgumentError("image_size", 200, "must be a multiple of the patch size 16\n(the patches tile it)",
                          ("give ", Named("image_size", 208), " or another multiple of 16"), usage=True)
    assert isinstance(error, ValueError)
    assert (error.argument, error.value, error.usage) == ("image_size", 200, True)
    assert str(error) == ("image_size=200: must be a multiple of the patch size 16 (the patches tile it); "
                          "give image_size=208 or another multiple of 16")


def test_an_argument_error_renders_each_named_argument_with_the_caller_s_spelling():
    from keras_cait.errors import ArgumentError, Named

    error = ArgumentError("val_fraction", 1.5, ("must be below 1 with ", Named("data", "photos")),
                          ("give ", Named("val_data", shown="FOLDER"), " or ", Named("epochs")))
    assert str(error) == "val_fraction=1.5: must be below 1 with data='photos'; give val_data=FOLDER or epochs"
    flags = error.render(lambda named: f"<{named.argument}>")
    assert flags == "<val_fraction>: must be below 1 with <data>; give <val_data> or <epochs>"


def test_an_argument_error_survives_pickling():
    import pickle

    from keras_cait.errors import ArgumentError, Named

    error = ArgumentError("weights", "x.bin", "unknown suffix", ("give ", Named("weights", None)), usage=True)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.argument, copy.value, copy.usage) == (
        ArgumentError, str(error), "weights", "x.bin", True)


def test_a_missing_extra_is_named_with_its_pip_install(monkeypatch):
    import sys

    from keras_cait.errors import ExtraMissing, require_extra

    monkeypatch.setitem(sys.modules, "no_such_module_of_an_extra", None)
    with pytest.raises(ExtraMissing) as raised:
        require_extra("export_thing", "thing", "json", "no_such_module_of_an_extra")
    assert isinstance(raised.value, ImportError)
    assert (raised.value.module, raised.value.extra) == ("no_such_module_of_an_extra", "thing")
    assert str(raised.value) == ('export_thing needs no_such_module_of_an_extra, which is not installed; '
                                 'pip install "keras-cait[thing]"')
    assert require_extra("export_thing", "thing", "json") is sys.modules["json"]


def test_an_installed_module_that_fails_to_import_keeps_its_own_error(tmp_path, monkeypatch):
    import sys

    from keras_cait.errors import ExtraMissing, require_extra

    (tmp_path / "broken_extra_module.py").write_text("import no_such_dependency_of_it\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_extra_module", raising=False)
    with pytest.raises(ModuleNotFoundError) as raised:
        require_extra("export_thing", "thing", "broken_extra_module")
    assert not isinstance(raised.value, ExtraMissing) and raised.value.name == "no_such_dependency_of_it"


def test_an_error_of_another_kind_names_its_arguments_as_parts():
    from keras_cait.errors import Named, Said
    from keras_cait.weights import DownloadError

    error = DownloadError("No network. Pass a local file: ", Named("weights", "/path/to/model.safetensors"), ".")
    assert isinstance(error, ConnectionError) and isinstance(error, Said)
    assert str(error) == "No network. Pass a local file: weights='/path/to/model.safetensors'."
    assert error.render(lambda named: f"--{named.argument} {named.value}") == (
        "No network. Pass a local file: --weights /path/to/model.safetensors.")


def test_a_count_takes_its_noun_in_the_singular_only_for_one():
    from keras_cait.errors import counted

    assert [counted(n, "epoch") for n in (0, 1, 2)] == ["0 epochs", "1 epoch", "2 epochs"]
    assert [counted(n, "class", "classes") for n in (1, 3)] == ["1 class", "3 classes"]
    assert counted(1281167, "image") == "1,281,167 images"


@pytest.mark.parametrize("value, minimum", [(3, 1), (np.int64(3), 1), (1, 1), (0, 0), (np.uint8(2), 0)])
def test_a_count_is_taken_as_a_python_int(value, minimum):
    from keras_cait.errors import checked_count

    taken = checked_count("batch_size", value, 64, minimum=minimum)
    assert type(taken) is int and taken == int(value)


@pytest.mark.parametrize("value, minimum, problem", [
    (0, 1, "must be a positive integer, the images per step"),
    (-1, 0, "must be a non-negative integer, the images per step"),
    (2.0, 1, "must be a positive integer, the images per step, not float"),
    ("4", 1, "must be a positive integer, the images per step, not str"),
    (True, 1, "must be a positive integer, the images per step, not bool"),
    (np.bool_(True), 0, "must be a non-negative integer, the images per step, not bool"),
    (None, 1, "must be a positive integer, the images per step, not NoneType")])
def test_anything_but_a_count_in_range_is_refused_by_name_with_an_example(value, minimum, problem):
    from keras_cait.errors import ArgumentError, checked_count

    with pytest.raises(ArgumentError) as refused:
        checked_count("batch_size", value, 64, minimum=minimum, note=", the images per step")
    assert (refused.value.argument, refused.value.usage) == ("batch_size", True)
    assert str(refused.value) == f"batch_size={value!r}: {problem}; e.g. batch_size=64"
