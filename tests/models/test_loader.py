"""keras_cait.models.loader: one loader of a name, a .keras file or a model; its errors as data; the
weights, `None` and the head's initialiser the same through every door (the constructors,
`load_classifier`, the commands and keras-hub's presets)."""

import re

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.cli import main
from keras_cait.errors import ArgumentError
from keras_cait.models import (
    CaiTModel, SelfAttentionBlock, checked_weights, has_dtype_policy, load_classifier, with_new_head,
)
from keras_cait.models.architecture import classifier_head
from tests.conftest import TINY_CAIT


@pytest.fixture
def saved(tiny_cait, tmp_path):
    """A 10-class tiny CaiT saved in float32 as .keras: (path, model)."""
    model = tiny_cait(classes=10)
    path = str(tmp_path / "tiny.keras")
    model.save(path)
    return path, model


def images(side=32, count=2):
    return np.random.default_rng(0).uniform(0, 255, (count, side, side, 3)).astype("float32")


def test_a_keras_file_and_a_model_load_as_the_classifier_they_hold(saved):
    path, model = saved

    loaded = load_classifier(path)

    assert isinstance(loaded, CaiTModel) and loaded.output_shape == (None, 10)
    np.testing.assert_allclose(loaded.predict(images(), verbose=0), model.predict(images(), verbose=0), rtol=1e-5)
    assert load_classifier(model) is model  # nothing asked that it does not have already


@pytest.mark.parametrize("caller_policy", ["float32", "mixed_float16"])
def test_dtype_rebuilds_a_file_under_it_and_leaves_the_global_policy(saved, policy, caller_policy):
    path, model = saved
    policy(caller_policy)

    loaded = load_classifier(path, dtype="mixed_bfloat16")

    assert has_dtype_policy(loaded, "mixed_bfloat16")
    assert keras.config.dtype_policy().name == caller_policy
    assert has_dtype_policy(load_classifier(path), "float32"), "without dtype the file keeps its own"
    np.testing.assert_allclose(loaded.predict(images(), verbose=0), model.predict(images(), verbose=0), atol=0.05)


def test_dtype_builds_a_name_under_it_and_leaves_the_global_policy():
    built = load_classifier("XXS24", weights=None, image_size=32, dtype="mixed_float16")

    assert has_dtype_policy(built, "mixed_float16")
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize("route", ["name", "file"])
@pytest.mark.parametrize("image_size, problem", [
    (200, "image_size=200: must be a multiple of the patch size 16; e.g. image_size=208"),
    ("224", "image_size='224': must be a positive integer multiple of the patch size 16, an int, not str; "
            "e.g. image_size=224"),
    (0, "image_size=0: must be a positive integer multiple of the patch size 16; e.g. image_size=224"),
])
def test_an_image_size_is_blamed_on_image_size_before_anything_is_built(saved, route, image_size, problem,
                                                                         monkeypatch):
    from keras_cait.models import variants

    monkeypatch.setattr(variants, "build_cait", lambda **kwargs: pytest.fail("a model was built"))
    model = saved[0] if route == "file" else "XXS24"

    with pytest.raises(ArgumentError) as refused:
        load_classifier(model, weights="imagenet", image_size=image_size)

    assert str(refused.value) == problem
    assert (refused.value.argument, refused.value.value, refused.value.usage) == ("image_size", image_size, True)


def test_a_headless_file_is_no_classifier_of_its_width(tiny_cait, tmp_path):
    """A CaiT saved with include_top=False and pooling outputs (batch, width): it was loaded as a
    classifier of `width` classes."""
    path = str(tmp_path / "notop.keras")
    tiny_cait(include_top=False, pooling="token").save(path)
    with pytest.raises(ArgumentError) as refused:
        load_classifier(path)
    assert str(refused.value) == (f"model={path!r}: outputs (None, {TINY_CAIT['embed_dim']}), its token_pool features "
                                  "(it has no head); give classes=N for a new head, or include_top=False for its "
                                  "features")
    assert load_classifier(path, classes=4).output_shape == (None, 4)
    assert load_classifier(path, include_top=False).output_shape == (None, TINY_CAIT["embed_dim"])


def test_a_file_at_another_image_size_is_rebuilt_at_it(saved):
    path, model = saved

    assert load_classifier(path, image_size=48).input_shape == (None, 48, 48, 3)


@pytest.mark.parametrize("spelling", [None, "none", "None", "NONE", " none "])
def test_none_in_every_spelling_is_one_value(spelling):
    assert checked_weights(spelling) is None


def test_a_missing_weights_file_is_named_once(tmp_path):
    missing = str(tmp_path / "absent.pt")

    with pytest.raises(ArgumentError) as refused:
        load_classifier("XXS24", weights=missing, image_size=32)

    assert str(refused.value).startswith(f"weights={missing!r}: no such file; give weights='imagenet'")
    assert str(refused.value).count(missing) == 1  # no prefix added twice
    assert (refused.value.argument, refused.value.value, refused.value.usage) == ("weights", missing, False)


def test_a_keras_file_that_is_not_a_cait_is_refused_in_one_line(tmp_path):
    convolutional = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3),
                                      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    numbers = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    for model, problem in ((convolutional, "not a CaiT"), (numbers, "takes inputs of shape (None, 8), not images")):
        path = str(tmp_path / f"{model.name}.keras")
        model.save(path)
        with pytest.raises(ArgumentError, match=rf"^model='{path}': .*{re.escape(problem)}") as refused:
            load_classifier(path)
        assert refused.value.argument == "model" and "\n" not in str(refused.value)


def test_a_path_that_is_no_keras_file_is_named_as_a_path_not_as_a_variant_name(tmp_path, monkeypatch):
    # Before: 'runs/photos/best.kears' (a typo), 'model.h5' and a checkpoint given as the model were
    # "unknown CaiT model; use a variant (XXS24, ...)", and a pathlib path "not a name, a path or a model".
    (tmp_path / "model.h5").write_bytes(b"not a model")
    (tmp_path / "timm.safetensors").write_bytes(b"weights")
    for given, problem, allowed in [
        (f"{tmp_path}/best.kears", "no such file", "give a model saved with model.save('name.keras')"),
        (tmp_path / "best.kears", "no such file", "give a model saved with model.save('name.keras')"),
        ("best.kears", "no such file", "give a model saved with model.save('name.keras')"),
        (str(tmp_path / "model.h5"), "is not a .keras model", "give a model saved with model.save('name.keras')"),
        (str(tmp_path / "timm.safetensors"), "is a checkpoint, not a .keras model",
         f"give a variant name with the checkpoint, e.g. weights='{tmp_path / 'timm.safetensors'}'"),
    ]:
        with pytest.raises(ArgumentError) as refused:
            load_classifier(given)
        assert str(refused.value) == f"model={str(given)!r}: {problem}; {allowed}" + (
            ", or a CaiT variant name" if allowed.startswith("give a model saved") else "")
        assert refused.value.argument == "model"
    with pytest.raises(ArgumentError, match=r"^model='XXS25': unknown CaiT model"):
        load_classifier("XXS25")
    import zipfile

    with zipfile.ZipFile(tmp_path / "notes.keras", "w") as archive:  # a zip without config.json: a raw KeyError
        archive.writestr("a.txt", "x")
    with pytest.raises(ArgumentError) as refused:
        load_classifier(str(tmp_path / "notes.keras"))
    assert str(refused.value).startswith(f"model='{tmp_path / 'notes.keras'}': is not a readable .keras model: "
                                         "There is no item named 'config.json' in the archive; give a model saved")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "XXS24").write_bytes(b"")  # a file named as a variant: the name is still the variant's
    assert load_classifier("XXS24", weights=None, image_size=32).output_shape == (None, 1000)


@pytest.mark.parametrize("options, argument", [
    (dict(weights=None), "weights"),
    (dict(include_top=False, classes=3), "classes"),
    (dict(pooling="avg"), "pooling"),
    (dict(pooling="max"), "pooling"),
    (dict(dtype="float64x"), "dtype"),
    (dict(drop_path_rate=1.5), "drop_path_rate"),
])
def test_a_setting_a_file_cannot_take_is_refused_naming_it(saved, options, argument):
    with pytest.raises(ArgumentError) as refused:
        load_classifier(saved[0], **options)

    assert refused.value.argument == argument and str(refused.value).startswith(f"{argument}=")


@pytest.mark.parametrize("activation, line", [
    # ignored: the file's softmax applied, where logits were asked for
    (None, r"^classifier_activation=None: applies to a variant name or a new head; the model's head keeps its own "
           r"activation 'softmax'; leave classifier_activation out, or give classes for a new head$"),
    ("sigmoid", r"^classifier_activation='sigmoid': applies to a variant name or a new head"),
    ("softmaxx", r"^classifier_activation='softmaxx': not a Keras activation; e\.g\. 'softmax', or None for logits$"),
])
def test_an_activation_a_file_s_own_head_would_ignore_is_refused_naming_it(saved, activation, line):
    path, model = saved
    for given in (path, model):
        with pytest.raises(ArgumentError, match=line) as refused:
            load_classifier(given, classifier_activation=activation)
        assert refused.value.argument == "classifier_activation" and refused.value.usage


def test_softmax_asked_of_a_head_that_gives_logits_is_refused_and_left_out_keeps_the_logits(tiny_cait, tmp_path):
    logits = tiny_cait(classes=10, classifier_activation=None)
    logits.save(tmp_path / "logits.keras")
    for given in (tmp_path / "logits.keras", logits):
        with pytest.raises(ArgumentError, match=r"^classifier_activation='softmax': applies to a variant name or a "
                                                r"new head; the model's head keeps its own activation 'linear'"):
            load_classifier(given, classifier_activation="softmax")
        kept = load_classifier(given)
        assert kept.get_layer("predictions").activation is keras.activations.linear


def test_an_activation_that_is_the_head_s_own_or_goes_on_a_new_head_is_taken(tiny_cait, saved):
    path, model = saved
    assert load_classifier(path, classifier_activation="softmax").output_shape == (None, 10)
    logits = tiny_cait(classes=10, classifier_activation=None)
    assert load_classifier(logits, classifier_activation=None) is not None
    assert load_classifier(logits, classifier_activation="linear") is not None
    assert load_classifier(logits).output_shape == (None, 10)  # the default leaves its head alone
    tuned = load_classifier(path, classes=3, classifier_activation=None)
    assert tuned.get_layer("predictions").activation is keras.activations.linear


def test_another_class_count_puts_a_new_head_on_the_file_s_features(saved):
    path, model = saved

    tuned = load_classifier(path, classes=3)
    features = load_classifier(path, include_top=False)

    assert tuned.output_shape == (None, 3) and features.output_shape == (None, TINY_CAIT["embed_dim"])
    for layer in model.layers[:-1]:  # everything but the head carries over
        for old, new in zip(layer.weights, tuned.get_layer(layer.name).weights):
            np.testing.assert_array_equal(np.asarray(old), np.asarray(new))


def test_drop_path_rate_applies_to_a_file(saved):
    loaded = load_classifier(saved[0], drop_path_rate=0.2)

    rates = {layer.drop_path_rate for layer in loaded.layers if isinstance(layer, SelfAttentionBlock)}
    assert rates == {0.2}


def test_a_name_with_another_class_count_gets_a_new_head_on_the_imagenet_backbone(monkeypatch):
    from keras_cait.models import variants

    loaded = []
    monkeypatch.setattr(variants, "load_imagenet_weights",
                        lambda model, arch: loaded.append((arch, [layer.name for layer in model.layers])))

    tuned = load_classifier("XXS24", image_size=32, classes=5)

    assert tuned.output_shape == (None, 5)
    [(arch, layers)] = loaded
    assert arch == "cait_xxs24_224" and "predictions" not in layers  # the checkpoint's 1000-class head is left out


@pytest.mark.parametrize("kind", ["weights.h5", "safetensors"])
def test_a_name_with_a_weights_file_and_another_class_count_gets_a_new_head_on_the_file_s_backbone(
        tmp_path, kind, timm_reference):
    """The docstring's "another number puts a new head" held for "imagenet" only: a file's 1000-class
    head was loaded into a 5-class model and refused (`keys whose shape does not fit: head.weight`, or
    `give classes=1000`). A file's head of that many classes is its own, loaded."""
    rng = np.random.default_rng(int(np.random.default_rng().integers(1 << 30)))
    classes, side = int(rng.integers(2, 9)), int(rng.choice([32, 48]))
    if kind == "safetensors":
        path = timm_reference.save(timm_reference.model("cait_xxs24_224", img_size=side, num_classes=classes))
    else:
        path = tmp_path / "tuned.weights.h5"
        keras_cait.CaiT_XXS24(weights=None, input_shape=(side, side, 3), classes=classes).save_weights(path)
    own = load_classifier("XXS24", weights=str(path), image_size=side)
    assert own.output_shape == (None, classes)  # the file's head, whatever its count
    new = load_classifier("XXS24", weights=str(path), image_size=side, classes=classes + 1)
    same = load_classifier("XXS24", weights=str(path), image_size=side, classes=classes)
    assert new.output_shape == (None, classes + 1)
    for layer in own.layers:
        if layer.weights and layer.name != "predictions":
            for a, b in zip(layer.get_weights(), new.get_layer(layer.name).get_weights()):
                np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(same.predict(images(side), verbose=0), own.predict(images(side), verbose=0))


# === The same answer through every door ===


def _one_line(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().err


def test_a_pt_checkpoint_is_a_weights_file_through_every_door(tmp_path, capsys, no_network):
    """A missing `.pt` is 'no such file' (its kind accepted) through the constructors, the loader,
    the command line and keras-hub's presets; a `.bin` is refused as an unknown kind by each."""
    from keras_cait.hub import CaiTImageClassifier

    image = str(tmp_path / "photo.png")
    keras.utils.save_img(image, images(count=1)[0])
    for suffix, problem in ((".pt", "no such file"), (".bin", "unknown weights name")):
        path = str(tmp_path / f"model{suffix}")
        doors = {
            "constructor": lambda: keras_cait.CaiT_XXS24(weights=path, input_shape=(32, 32, 3)),
            "loader": lambda: load_classifier("XXS24", weights=path, image_size=32),
            "preset": lambda: CaiTImageClassifier.from_preset("cait_xxs24_224", weights=path),
        }
        for door, call in doors.items():
            with pytest.raises(ArgumentError, match=f"^weights='{path}': {problem};") as refused:
                call()
            assert refused.value.argument == "weights", door
        line = _one_line(["predict", image, "--model", "cait_xxs24_224", "--weights", path], capsys)
        assert line.startswith(f"keras-cait predict: --weights {path}: {problem}; give --weights imagenet"), line


def test_weights_none_in_the_command_s_spelling_is_random_weights_through_every_door(monkeypatch):
    from keras_cait.hub import presets
    from keras_cait.models import variants

    built = []
    monkeypatch.setattr(variants, "load_file", lambda *args: pytest.fail("a file was read"))
    monkeypatch.setattr(variants, "load_imagenet_weights", lambda *args: pytest.fail("imagenet was fetched"))
    original = variants.build_cait
    monkeypatch.setattr(variants, "build_cait", lambda **kwargs: built.append(kwargs) or original(**kwargs))

    keras_cait.CaiT_XXS24(weights="None", input_shape=(32, 32, 3))
    load_classifier("XXS24", weights="none", image_size=32)
    assert len(built) == 2
    assert presets.weights_argument("cait_xxs24_224", True, {"weights": "none"}) is None
    assert presets.weights_argument("cait_xxs24_224", True, {"weights": "None"}) is None


def test_every_classifier_head_starts_from_the_one_initialiser(tiny_cait, saved):
    """build_cait's head, with_new_head's, the loader's new head and keras-hub's classifier's."""
    from keras_cait.hub import CaiTBackbone, CaiTImageClassifier

    def initialisers(layer):
        return (keras.saving.serialize_keras_object(layer.kernel_initializer),
                keras.saving.serialize_keras_object(layer.bias_initializer))

    expected = initialisers(classifier_head(3, None, "float32"))
    backbone = CaiTBackbone(**TINY_CAIT, image_shape=(32, 32, 3))
    heads = {
        "build_cait": tiny_cait(classes=3).get_layer("predictions"),
        "with_new_head": with_new_head(tiny_cait(), 3).get_layer("predictions"),
        "load_classifier": load_classifier(saved[0], classes=3).get_layer("predictions"),
        "keras-hub": CaiTImageClassifier(backbone=backbone, num_classes=3).output_dense,
    }
    assert {door: initialisers(head) for door, head in heads.items()} == dict.fromkeys(heads, expected)
    assert expected[0]["class_name"] == "RandomNormal" and expected[0]["config"]["stddev"] == 0.02  # timm's
