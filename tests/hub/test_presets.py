"""keras_cait.hub.presets: the released checkpoints as keras-hub presets, and what their `weights=`
takes (the loader's one answer: `keras_cait.models.checked_weights`). Nothing here builds a model."""

import pytest

from keras_cait.errors import ArgumentError
from keras_cait.hub import presets
from keras_cait.models import VARIANTS
from keras_cait.weights import CHECKPOINTS, WEIGHT_FILES


def test_a_preset_is_its_variant_at_its_checkpoint_s_resolution():
    for preset in presets.PRESETS:
        config = presets.backbone_config(preset)
        side = CHECKPOINTS[preset]["resolution"]
        assert config.pop("image_shape") == (side, side, 3) and presets.image_size(preset) == (side, side)
        assert config == VARIANTS[preset.split("_")[1].upper()]


def test_an_unknown_cait_name_is_refused_naming_the_released_ones(tmp_path):
    with pytest.raises(ArgumentError) as refused:
        presets.is_released("cait_zz99_224")

    assert refused.value.argument == "preset" and ", ".join(presets.PRESETS) in str(refused.value)
    assert presets.is_released("cait_s24_224") and not presets.is_released(str(tmp_path))


@pytest.mark.parametrize("suffix", WEIGHT_FILES)
def test_every_weights_file_the_loader_takes_is_read_by_a_preset(suffix, tmp_path):
    path = tmp_path / f"model{suffix}"
    path.write_bytes(b"")

    assert presets.weights_argument("cait_xxs24_224", True, {"weights": path}) == str(path)


@pytest.mark.parametrize("load_weights, given, expected", [
    (True, {}, "imagenet"), (False, {}, None), (True, {"weights": None}, None), (True, {"weights": "none"}, None),
    (False, {"weights": "imagenet"}, None), (False, {"weights": "None"}, None),
])
def test_no_file_means_imagenet_or_random_weights(load_weights, given, expected):
    options = dict(given)

    assert presets.weights_argument("cait_xxs24_224", load_weights, options) == expected
    assert "weights" not in options  # taken out: keras-hub's own from_preset never sees it


@pytest.mark.parametrize("preset, load_weights, weights, problem", [
    ("cait_xxs24_224", True, "model.bin", "unknown weights name"),
    ("cait_xxs24_224", True, "missing.pt", "no such file"),
    ("cait_xxs24_224", False, "model.pt", "load_weights=False"),
    ("FOLDER", True, "model.safetensors", "released CaiT presets"),
])
def test_weights_that_cannot_be_read_are_refused_naming_weights(preset, load_weights, weights, problem, tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    preset = str(tmp_path) if preset == "FOLDER" else preset

    with pytest.raises(ArgumentError) as refused:
        presets.weights_argument(preset, load_weights, {"weights": str(tmp_path / weights)})

    assert refused.value.argument == "weights" and problem in str(refused.value)
    assert "\n" not in str(refused.value)
