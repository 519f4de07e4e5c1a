"""The models of a run (`keras_cait.training.run_models`): each is loaded through
`keras_cait.models.load_classifier`, under the run's precision, the global policy left alone."""

import keras
import numpy as np
import pytest

from keras_cait.training import RECIPES, run_models
from keras_cait.training.run_errors import RunError

NAMES = ["cat", "dog", "fox"]


@pytest.mark.parametrize("recipe", ["transfer", "deit-highres"])
def test_a_keras_file_is_fine_tuned_in_the_run_s_precision_at_its_own_side(recipe, tiny_cait, tmp_path):
    path = str(tmp_path / "model.keras")
    saved = tiny_cait(classes=len(NAMES))
    saved.save(path)
    model = run_models.classifier(path, "imagenet", RECIPES[recipe], None, "mixed_bfloat16", NAMES)
    assert keras.config.dtype_policy().name == "float32"
    assert model.input_shape[1:3] == saved.input_shape[1:3]
    assert list(model.class_names) == NAMES and model.output_shape[-1] == len(NAMES)
    blocks = [layer for layer in model.layers if "attention_block" in layer.name]
    assert len(blocks) == 4 and {layer.dtype_policy.name for layer in blocks} == {"mixed_bfloat16"}
    head = model.get_layer("predictions")
    # deit-highres keeps the file's head (its 3 classes are the data's); transfer puts on a new one
    kept = np.allclose(keras.ops.convert_to_numpy(head.kernel), keras.ops.convert_to_numpy(
        saved.get_layer("predictions").kernel))
    assert kept == (recipe == "deit-highres")


def test_a_name_with_weights_none_in_any_spelling_is_random_at_its_checkpoint_s_side(no_network):
    model = run_models.classifier("XXS24", "None", RECIPES["scratch"], None, "float32", NAMES)
    assert model.input_shape[1:3] == (224, 224) and list(model.class_names) == NAMES
    assert keras.config.dtype_policy().name == "float32"


def test_unknown_weights_are_refused_naming_weights(no_network, tmp_path):
    with pytest.raises(RunError) as raised:
        run_models.classifier("XXS24", str(tmp_path / "model.bin"), RECIPES["transfer"], None, "float32", NAMES)
    assert (raised.value.argument, raised.value.value) == ("weights", str(tmp_path / "model.bin"))
    assert "unknown weights name" in str(raised.value) and ".safetensors" in str(raised.value)


def test_train_s_model_is_built_under_the_run_s_precision(no_network):
    model = run_models.new_model("XXS24", RECIPES["deit"], 32, 3, "mixed_bfloat16")
    assert model.input_shape[1:3] == (32, 32) and model.output_shape[-1] == 3
    assert model.get_layer("predictions").dtype_policy.name == "float32"
    assert keras.config.dtype_policy().name == "float32"
    blocks = [layer for layer in model.layers if "attention_block" in layer.name]
    assert blocks and {layer.dtype_policy.name for layer in blocks} == {"mixed_bfloat16"}


def test_a_teacher_file_that_is_no_keras_model_is_refused_naming_teacher(tmp_path):
    path = tmp_path / "teacher.keras"
    path.write_text("not a zip")
    with pytest.raises(RunError) as raised:
        run_models.teacher_model(str(path), RECIPES["deit"].replace(distillation_type="hard"), None, "float32")
    assert (raised.value.argument, raised.value.value) == ("teacher", str(path))
    assert "not a .keras model" in str(raised.value)


def test_the_teacher_the_messages_suggest_is_one_the_run_takes():
    """They suggested teacher='RegNetY160', which Keras 3's applications do not have: the same check then
    refused it as 'neither a .keras file nor a keras.applications model'."""
    import re

    distilling = RECIPES["deit"].replace(distillation_type="hard")
    with pytest.raises(RunError) as raised:
        run_models.check_teacher(None, distilling)
    suggested = re.search(r"teacher='(\w+)'", str(raised.value)).group(1)
    run_models.check_teacher(suggested, distilling)  # taken
    assert callable(getattr(keras.applications, suggested))
    # Every message that suggests a teacher suggests that one.
    for wrong, problem in (("NoSuchNet", "neither a .keras file nor a keras.applications model"),
                           ("gone.keras", "no such file")):
        with pytest.raises(RunError) as raised:
            run_models.check_teacher(wrong, distilling)
        assert problem in str(raised.value) and f"teacher='{suggested}'" in str(raised.value)


def test_a_keras_applications_teacher_whose_weights_cannot_download_is_refused_naming_teacher(monkeypatch):
    """Offline, Keras' own `Exception: URL fetch failure on https://storage.googleapis.com/...` reached the
    caller bare."""
    def offline(weights):
        raise Exception("URL fetch failure on https://storage.googleapis.com/x.h5: None -- [Errno -2] Name or "
                        "service not known")

    monkeypatch.setattr(keras.applications, "ConvNeXtTiny", offline)
    with pytest.raises(RunError) as raised:
        run_models.teacher_model("ConvNeXtTiny", RECIPES["deit"].replace(distillation_type="hard"), None, "float32")
    assert (raised.value.argument, raised.value.value) == ("teacher", "ConvNeXtTiny")
    assert str(raised.value) == (
        "teacher='ConvNeXtTiny': keras.applications.ConvNeXtTiny could not load its ImageNet weights (URL fetch "
        "failure on https://storage.googleapis.com/x.h5: None -- [Errno -2] Name or service not known); Keras "
        "downloads them once into ~/.keras/models: build the model once where there is network, or give a "
        ".keras teacher")
