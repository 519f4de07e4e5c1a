"""keras_cait.deprecation: every old path of a moved module imports, with a DeprecationWarning
naming the new one, and is the new module itself."""

import json
import subprocess
import sys

from keras_cait.deprecation import MOVED
from tests.test_imports import REPOSITORY

CHECK = """
import importlib, json, sys, warnings
import keras_cait
from keras_cait.deprecation import MOVED

found = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = {}
        exec(compile(f"import {old} as module", __file__, "exec"), names)  # an import statement of this file
        module = names["module"]
    found[old] = {
        "same": module is importlib.import_module(new),
        "spec": module.__spec__.name,
        "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
    }
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    del sys.modules["keras_cait.model"], keras_cait.model
    attribute = keras_cait.model  # read as an attribute, never imported by that name
found["attribute"] = {"same": attribute is importlib.import_module("keras_cait.models.architecture"),
                      "warnings": [w.category.__name__ for w in caught]}
print(json.dumps(found))
"""


def test_every_old_path_is_the_new_module_with_a_deprecation_warning_at_the_importing_line(tmp_path):
    script = tmp_path / "old_paths.py"
    script.write_text(CHECK)
    done = subprocess.run([sys.executable, str(script)], cwd=REPOSITORY, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": REPOSITORY, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for old, new in MOVED.items():
        assert found[old]["same"], f"{old} is not {new}"
        assert found[old]["spec"] == new, "the new module lost its own spec"
        assert found[old]["warnings"] == [["DeprecationWarning", f"{old} moved to {new}; import it from there "
                                           "(the old path goes in the next release).", str(script)]]
    assert found["attribute"] == {"same": True, "warnings": ["DeprecationWarning"]}


def test_every_name_moved_out_of_a_module_reads_there_with_a_deprecation_warning_at_the_reading_line():
    import importlib
    import warnings

    import pytest

    from keras_cait.deprecation import MOVED_NAMES

    for (old, new), names in MOVED_NAMES.items():
        module, destination = importlib.import_module(old), importlib.import_module(new)
        for name in names:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = getattr(module, name)
            assert value is getattr(destination, name), f"{old}.{name}"
            assert [(w.category, str(w.message), w.filename) for w in caught] == [
                (DeprecationWarning, f"{old}.{name} moved to {new}; import it from there (the old path goes in the "
                                     "next release).", __file__)], f"{old}.{name}"
            assert not hasattr(module, "__dict__") or name not in vars(module), f"{old}.{name} is still defined there"
        with pytest.raises(AttributeError, match=f"module '{old}' has no attribute 'nothing_here'"):
            module.nothing_here


# The old paths users may have written, listed here by hand: a name dropped from MOVED_NAMES by
# mistake still fails this test (the one above reads the table itself).
OLD_IMPORTS = {
    "keras_cait.training.sources": ("check_images", "find_undecodable", "undecodable_named", "ImageCheck",
                                    "Undecodable"),
    "keras_cait.models.architecture": ("SelfAttentionBlock", "ClassAttentionBlock", "LAYER_NORM_EPSILON",
                                       "float32_gelu", "is_mixed", "float32_if_mixed", "layer_dtype",
                                       "has_dtype_policy", "FLOAT32_UNDER_MIXED", "check_images", "checked_image_size",
                                       "check_input_shape", "channels_last_shape", "image_shape", "class_count",
                                       "checked_class_names", "class_names_of"),
}


def test_the_old_import_paths_still_import_with_a_deprecation_warning():
    import importlib

    import pytest

    for module, names in OLD_IMPORTS.items():
        for name in names:
            with pytest.warns(DeprecationWarning, match=f"{module}.{name} moved to "):
                assert getattr(importlib.import_module(module), name) is not None
