"""keras_cait.export.export_saved_model: the contract TF Serving relies on."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tensorflow.core.protobuf import saved_model_pb2

from keras_cait.images.evaluation_transform import IMAGE_FORMATS
from keras_cait.export import saved_model as export
from keras_cait.cli import commands
from keras_cait.errors import ArgumentError
from keras_cait.export import check_destination, export_saved_model
from keras_cait.preprocessing import imagenet_classes, load_image
from tests.export.helpers import (
    SIDE,
    SIGNATURE_OUTPUTS,
    encode,
    gif_of_frames,
    photo,
    png_header,
    run_in_fresh_process,
    serving_contract,
    signature_types,
    small_model,
)

IMAGENET_NAMES = np.array([name for _, name in imagenet_classes()])

# (height, width, format): portrait and landscape, down- and upsampling, crop
# offsets that round half to even (32×37 → 2.5 → 2; 61×45 → 5.5 → 6).
PHOTOS = [(61, 45, "PNG"), (200, 301, "JPEG"), (20, 27, "PNG"), (32, 37, "PNG"), (480, 640, "JPEG")]


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    paths = []
    for seed, (height, width, image_format) in enumerate(PHOTOS):
        path = folder / f"{seed}.{image_format.lower()}"
        path.write_bytes(encode(photo(height, width, seed), image_format))
        paths.append(path)
    return paths


def _numpy(outputs):
    return {name: value.numpy() for name, value in outputs.items()}


# === The signatures ===


def test_three_predict_signatures_with_the_documented_names_shapes_and_dtypes(saved_model_dir):
    assert signature_types(saved_model_dir) == serving_contract(SIDE, SIDE, classes=1000, top_k=5)


def test_serving_default_gives_what_model_predict_gives(loaded, model, images):
    outputs = _numpy(loaded.signatures["serving_default"](images=tf.constant(images)))
    expected = model.predict(images, verbose=0)
    np.testing.assert_allclose(outputs["probabilities"], expected, rtol=1e-5, atol=0)
    best = np.argsort(-expected, axis=1)[:, :5]
    np.testing.assert_array_equal(outputs["top_k_indices"], best)
    np.testing.assert_allclose(outputs["top_k_probabilities"], np.take_along_axis(expected, best, 1), rtol=1e-5)
    np.testing.assert_array_equal(outputs["top_k_classes"].astype(str), IMAGENET_NAMES[best])


def test_serving_uint8_gives_what_serving_default_gives(loaded, images):
    as_float = _numpy(loaded.signatures["serving_default"](images=tf.constant(images)))
    as_uint8 = _numpy(loaded.signatures["serving_uint8"](images=tf.constant(images.astype("uint8"))))
    for name in SIGNATURE_OUTPUTS:
        np.testing.assert_array_equal(as_uint8[name], as_float[name])


@pytest.mark.large
def test_runs_in_a_fresh_process_that_cannot_import_keras_cait(saved_model_dir, model, images, tmp_path):
    png = encode(photo(40, 50), "PNG")
    outputs = run_in_fresh_process(saved_model_dir, images, png, tmp_path)
    np.testing.assert_allclose(outputs["probabilities"], model.predict(images, verbose=0), rtol=1e-5, atol=0)
    (tmp_path / "image.png").write_bytes(png)
    expected = model.predict(load_image(tmp_path / "image.png", SIDE)[None], verbose=0)
    np.testing.assert_allclose(outputs["bytes_probabilities"], expected, rtol=1e-5, atol=0)


def test_nothing_in_the_graph_requires_xla(saved_model_dir):
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model_dir / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    functions = graph.library.function
    assert len(functions) > 10
    assert [f.signature.name for f in functions if f.attr["_XlaMustCompile"].b] == []
    ops = {node.op for f in functions for node in f.node_def} | {node.op for node in graph.node}
    assert not {op for op in ops if op.startswith("Xla")}


# === serving_bytes: the reference evaluation transform in the graph ===


def timm_evaluation(path, side):
    """timm's evaluation transform for CaiT (crop_pct 1.0) on a PIL image, as uint8 pixels."""
    # torchvision is already loaded: tests/conftest.py imports timm before TensorFlow.
    from torchvision import transforms

    reference = transforms.Compose(
        [transforms.Resize(side, interpolation=transforms.InterpolationMode.BICUBIC), transforms.CenterCrop(side)]
    )
    return np.asarray(reference(Image.open(path).convert("RGB")), dtype="float32")


@pytest.mark.parametrize("index", range(len(PHOTOS)))
def test_bytes_are_decoded_and_cropped_like_load_image_and_timm(photo_files, index):
    path = photo_files[index]
    in_graph = export._decode_and_crop(tf.constant([path.read_bytes()]), SIDE, SIDE)[0].numpy()
    np.testing.assert_array_equal(in_graph, load_image(path, SIDE))
    difference = np.abs(in_graph - timm_evaluation(path, SIDE))
    # Measured (docs/export.md): mean 0.00-0.21 levels, 99th percentile <= 1. A bilinear or
    # non-antialiased resize gives a mean >= 1, a crop one pixel off >= 10, BGR >= 60.
    assert difference.mean() <= 0.3 and np.percentile(difference, 99) <= 1, (difference.mean(), difference.max())


def test_bytes_signature_gives_the_probabilities_of_timms_transform(loaded, model, photo_files):
    files = tf.constant([path.read_bytes() for path in photo_files])
    served = loaded.signatures["serving_bytes"](image_bytes=files)["probabilities"].numpy()
    with_pil = model.predict(np.stack([timm_evaluation(path, SIDE) for path in photo_files]), verbose=0)
    # Pixels differ by at most a level or two (PIL rounds between its two resize
    # passes); measured relative difference of the probabilities <= 2.3e-3.
    np.testing.assert_allclose(served, with_pil, rtol=5e-3, atol=0)

    with_load_image = model.predict(np.stack([load_image(path, SIDE) for path in photo_files]), verbose=0)
    np.testing.assert_allclose(served, with_load_image, rtol=1e-5, atol=0)


def test_a_1x5000_png_is_classified_in_bounded_memory_like_load_image(loaded, model, tmp_path):
    """Resized whole, this 99-byte file would become 32 × 160,000 (224 × 1,120,000 on a
    224 model, 4 GB); only the centre window is computed."""
    path = tmp_path / "line.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (1, 5000, 3), dtype=np.uint8)).save(path)
    served = loaded.signatures["serving_bytes"](image_bytes=tf.constant([path.read_bytes()]))
    expected = model.predict(load_image(path, SIDE)[None], verbose=0)
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-5, atol=0)


# === Bad input: INVALID_ARGUMENT naming what is expected, in Python and as TF Serving runs it ===

EXPECTED = f"[batch, {SIDE}, {SIDE}, 3]"
PNG = encode(photo(40, 50), "PNG")


def _zeros(*shape, dtype="float32"):
    return np.zeros(shape, dtype)


# case: (signature, input name, value, texts that the error message must contain)
BAD_INPUTS = {
    "no batch axis": ("serving_default", "images", _zeros(32, 32, 3), [EXPECTED, "got [32, 32, 3]"]),
    "another size": ("serving_default", "images", _zeros(1, 48, 48, 3), [EXPECTED, "got [1, 48, 48, 3]"]),
    # As many patches as 32×32: without the check this would run and answer wrongly.
    "16x64": ("serving_default", "images", _zeros(1, 16, 64, 3), [EXPECTED, "got [1, 16, 64, 3]"]),
    "grey": ("serving_default", "images", _zeros(1, 32, 32, 1), [EXPECTED, "got [1, 32, 32, 1]"]),
    "RGBA": ("serving_default", "images", _zeros(2, 32, 32, 4), [EXPECTED, "got [2, 32, 32, 4]"]),
    "normalised": ("serving_default", "images", _zeros(1, 32, 32, 3) - 1.5, ["0..255", "min -1.5"]),
    "NaN": ("serving_default", "images", _zeros(1, 32, 32, 3) * np.nan, ["0..255", "nan"]),
    "grey uint8": ("serving_uint8", "images", _zeros(1, 32, 32, 1, dtype="uint8"), [EXPECTED, "serving_uint8"]),
    "not an image": (
        "serving_bytes", "image_bytes", np.array([PNG, b"<html>404</html>"], object),
        [IMAGE_FORMATS, "entries [1]"],
    ),
    "no batch axis, bytes": ("serving_bytes", "image_bytes", np.array(PNG, object), ["list [batch]", "shape []"]),
    "truncated file": ("serving_bytes", "image_bytes", np.array([PNG[:100]], object), ["PNG"]),
    "decompression bomb": (
        "serving_bytes", "image_bytes", np.array([PNG, png_header(20_000, 9_000)], object),
        ["9000x20000 pixels; at most 89,478,485"],
    ),
    "GIF frame bomb": (  # a 64×64 screen holding a 12000×12000 frame
        "serving_bytes", "image_bytes", np.array([gif_of_frames(2, (12_000, 12_000))], object),
        ["2 frames of 12000x12000 pixels; at most 89,478,485"],
    ),
}


@pytest.mark.parametrize("runner", ["python", "tf_serving_session"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_invalid_argument_naming_what_is_expected(loaded, tf_serving_session, runner, case):
    signature, name, value, expected_texts = BAD_INPUTS[case]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        if runner == "python":
            loaded.signatures[signature](**{name: tf.constant(value)})
        else:
            tf_serving_session.run(signature, **{name: value})
    for text in expected_texts:
        assert text in error.value.message


# === Mixed precision, logits, class names ===


@pytest.mark.large
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_mixed_precision_model_serves_float32(policy, images, tmp_path):
    keras.config.set_dtype_policy(policy)
    try:
        features = small_model(include_top=False, pooling="token")
        logits = keras.layers.Dense(10, name="head")(features.output)  # a fine-tuned head, in half precision
        model = keras.Model(features.input, logits)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.output.dtype == policy.removeprefix("mixed_")
    names = [f"class {i}" for i in range(10)]

    export_saved_model(model, tmp_path / "1", top_k=3, class_names=names)

    assert signature_types(tmp_path / "1") == serving_contract(SIDE, SIDE, classes=10, top_k=3)
    serving_default = tf.saved_model.load(str(tmp_path / "1")).signatures["serving_default"]
    outputs = _numpy(serving_default(images=tf.constant(images)))
    # The linear head's logits got a softmax (from_logits was read from the model).
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(model.predict(images, verbose=0).astype("float32")))
    np.testing.assert_allclose(outputs["probabilities"], expected, atol=1e-6)
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1, rtol=1e-5)
    best = np.argsort(-expected, axis=1)[:, :3]
    np.testing.assert_array_equal(outputs["top_k_classes"].astype(str), np.array(names)[best])


def test_class_names_must_match_the_classes(tmp_path):
    model = small_model(classes=10)
    with pytest.raises(ValueError) as raised:
        export_saved_model(model, tmp_path / "1")
    assert (raised.value.argument, raised.value.value) == ("class_names", None)
    assert str(raised.value) == (
        "class_names=None: the model has 10 classes and no names of its own (ImageNet's are known for 1000 classes "
        "only), which the top_k_classes output lists; give class_names=[...] (10 names in index order), or name the "
        "model's classes: keras_cait.models.with_class_names(model, [...])")
    # The arguments in their order: a path that is no version folder is what is said first.
    with pytest.raises(ValueError) as raised:
        export_saved_model(model, tmp_path / "model.pt")
    assert raised.value.argument == "path"
    with pytest.raises(ValueError, match="has 3 names but .* has 10 classes"):
        export_saved_model(model, tmp_path / "1", class_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="top_k=11"):
        export_saved_model(model, tmp_path / "1", class_names=list("abcdefghij"), top_k=11)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path, class_names, argument, message", [
    (None, list("abcdefghij"), "path", "path=None: must be a str or os.PathLike, not NoneType; e.g. 'serving/cait/1' "
     "(a SavedModel version folder) or 'cait.onnx'"),
    ("1", "abc", "class_names", "class_names='abc': must be a list of names, not one str; give a list of str, one "
     "name per class"),
    ("1", [1, 2], "class_names", "class_names=[...]: holds 1 (int), not only str; give a list of str, one name per class"),
    ("1", ["a", "b", "c"], "class_names", "class_names=[...]: has 3 names but cait has 10 classes; give one name "
     "per class, in the order of the outputs"),
], ids=["path_none", "names_str", "names_int", "names_count"])
def test_a_path_that_is_no_path_and_wrong_class_names_are_refused_by_name(tmp_path, path, class_names, argument,
                                                                           message):
    from keras_cait.errors import ArgumentError

    model = small_model(classes=10)
    with pytest.raises(ArgumentError) as raised:
        export_saved_model(model, None if path is None else tmp_path / path, class_names=class_names)
    assert raised.value.argument == argument and raised.value.usage
    assert str(raised.value) == message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argument, value, allowed", [
    ("from_logits", "no", "True (the model outputs logits), False (probabilities) or None (read from its last layer)"),
    ("jit_compile", "no", "True (compile with XLA) or False"),
    ("jit_compile", None, "True (compile with XLA) or False"),
])
def test_a_true_or_false_argument_given_a_str_or_none_is_refused_naming_it(model, tmp_path, argument, value, allowed):
    """A YAML config's `no` is a truthy str: from_logits='no' put a softmax over the probabilities
    (every score flattened towards 1/classes), jit_compile='no' compiled with XLA."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as raised:
        export_saved_model(model, tmp_path / "1", **{argument: value})
    assert str(raised.value) == f"{argument}={value!r}: must be {allowed}, not {type(value).__name__}"
    assert raised.value.argument == argument
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argument, value, message", [
    ("top_k", "5", "top_k='5': must be an integer from 1 to the model's 10 classes; e.g. top_k=5, or leave it out "
                   "for that"),
    ("top_k", True, "top_k=True: must be an integer from 1 to the model's 10 classes; e.g. top_k=5, or leave it out "
                    "for that"),
    ("top_k", 0, "top_k=0: must be an integer from 1 to the model's 10 classes; e.g. top_k=5, or leave it out for "
                 "that"),
    ("compute_dtype", "bf16", "compute_dtype='bf16': must be 'float32' or 'bfloat16' (CPUs with bfloat16 units, and "
                              "GPUs)"),
])
def test_a_top_k_or_compute_dtype_from_a_config_is_refused_naming_it(tmp_path, argument, value, message):
    """top_k='5' (a str from a config) failed the range check with a bare TypeError, top_k=True
    listed one class; neither was an ArgumentError naming its argument."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as raised:
        export_saved_model(small_model(classes=10), tmp_path / "1", class_names=list("abcdefghij"),
                           **{argument: value})
    assert str(raised.value) == message
    assert raised.value.argument == argument
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_a_head_or_without_its_normalisation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="include_top=True"):
        export_saved_model(small_model(include_top=False), tmp_path / "1")
    with pytest.raises(ArgumentError, match=r"^model=<\w+>: was built with include_preprocessing=False, .*"
                                            r"build it with include_preprocessing=True") as raised:
        export_saved_model(small_model(include_preprocessing=False), tmp_path / "1")
    assert raised.value.argument == "model"
    assert list(tmp_path.iterdir()) == []


def _plain(inputs, outputs):
    return keras.Model(inputs, outputs, name="plain")


@pytest.mark.parametrize("build, argument, line", [
    (lambda: _two_outputs(), "model",
     r"^model=<plain>: has 1 inputs and 2 outputs, but a served classifier has one image input and one output"),
    (lambda: _plain(inputs := keras.Input((None, None, 3)), keras.layers.Dense(2)(
        keras.layers.GlobalAveragePooling2D()(inputs))), "model",
     r"^model=<plain>: takes inputs of shape \(None, None, None, 3\), but a served classifier takes"),
    (lambda: _plain(inputs := keras.Input((8, 8, 3)), keras.layers.Dense(2, activation="relu")(
        keras.layers.Flatten()(inputs))), "from_logits",
     r"^from_logits=None: is needed: the last layer of plain, '\w+', is neither linear nor softmax"),
])
def test_a_model_that_serves_no_classifier_is_refused_naming_the_argument(tmp_path, build, argument, line):
    """These were bare ValueErrors, which `except ArgumentError` missed and the command line could not
    re-spell."""
    with pytest.raises(ArgumentError, match=line) as raised:
        export_saved_model(build(), tmp_path / "1", class_names=["a", "b"])
    assert raised.value.argument == argument and raised.value.usage
    assert list(tmp_path.iterdir()) == []


def _two_outputs():
    inputs = keras.Input((8, 8, 3))
    features = keras.layers.Flatten()(inputs)
    return _plain(inputs, [keras.layers.Dense(2)(features), keras.layers.Dense(2)(features)])


# === Version folders and safe writes ===


@pytest.mark.parametrize("path", ["cait", "cait/0", "cait/v1", "cait/1.5", "cait.onnx"])
def test_the_path_must_end_in_a_version_number(model, tmp_path, path):
    with pytest.raises(ValueError, match="must be a positive integer"):
        export_saved_model(model, tmp_path / path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("version", ["01", "001", "+1", "١"])
def test_a_version_must_be_written_as_tf_serving_reads_it(tmp_path, version):
    with pytest.raises(ValueError, match="positive integer without leading zeros") as error:
        check_destination(tmp_path / "cait" / version)
    if version.isascii() and version.isdigit():
        assert repr(str(tmp_path / "cait" / "1")) in str(error.value)


def test_a_version_that_tf_serving_reads_as_an_existing_one_is_refused(tmp_path):
    (tmp_path / "cait" / "01").mkdir(parents=True)
    with pytest.raises(FileExistsError, match=r"reads .*01' as the same version 1"):
        check_destination(tmp_path / "cait" / "1", overwrite=True)


def test_an_existing_version_is_refused_and_left_alone(model, tmp_path):
    for version in ("1", "3"):
        (tmp_path / version).mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"version 1")
    with pytest.raises(FileExistsError, match="overwrite=True") as error:
        export_saved_model(model, tmp_path / "1")
    assert repr(str(tmp_path / "4")) in str(error.value)
    assert (tmp_path / "1" / "saved_model.pb").read_bytes() == b"version 1"


def _fail_half_way(obj, export_dir, *args, **kwargs):
    os.makedirs(os.path.join(export_dir, "variables"))
    with open(os.path.join(export_dir, "saved_model.pb"), "wb") as file:
        file.write(b"half a model")
    raise OSError("No space left on device")


def test_a_failed_export_leaves_no_version_folder(model, tmp_path, monkeypatch):
    # TensorFlow rebinds `tf.saved_model` to another module object during a process's first SavedModel save:
    # one export first, so that the patch below lands on the module the next exports call.
    export_saved_model(model, tmp_path / "warm" / "1")
    monkeypatch.setattr(tf.saved_model, "save", _fail_half_way)
    with pytest.raises(OSError, match="No space left"):
        export_saved_model(model, tmp_path / "cait" / "1")
    assert not (tmp_path / "cait").exists()  # the folders the export made are gone with it

    (tmp_path / "cait" / "1").mkdir(parents=True)
    (tmp_path / "cait" / "1" / "saved_model.pb").write_bytes(b"version 1")
    with pytest.raises(OSError, match="No space left"):
        export_saved_model(model, tmp_path / "cait" / "1", overwrite=True)
    assert os.listdir(tmp_path / "cait") == ["1"]
    assert os.listdir(tmp_path / "cait" / "1") == ["saved_model.pb"]
    assert (tmp_path / "cait" / "1" / "saved_model.pb").read_bytes() == b"version 1"


def test_overwrite_replaces_the_version(tmp_path, images):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "stale.txt").write_text("from the previous export")
    model = small_model(seed=1, classes=4)
    export_saved_model(model, tmp_path / "1", class_names=list("abcd"), top_k=2, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["1"]
    assert not (tmp_path / "1" / "stale.txt").exists()
    served = tf.saved_model.load(str(tmp_path / "1")).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(served["probabilities"].numpy(), model.predict(images, verbose=0), rtol=1e-5)


# === keras-cait export ===


def test_cli_export_checks_the_destination_before_building_a_model(tmp_path, monkeypatch):
    def build(*args, **kwargs):
        raise AssertionError("a model was built for a destination that cannot be written")

    monkeypatch.setattr(commands, "_loaded", build)
    (tmp_path / "1").mkdir()
    with pytest.raises(SystemExit, match="keras-cait export: Version folder .* exists"):
        commands.main(["export", str(tmp_path / "1"), "--weights", "none"])
    with pytest.raises(SystemExit, match="--quantization dynamic_int8: SavedModel .* For dynamic_int8, export to a .tflite file"):
        commands.main(["export", str(tmp_path / "2"), "--weights", "none", "--quantization", "dynamic_int8"])
    with pytest.raises(SystemExit, match="--top-k applies to SavedModels only"):
        commands.main(["export", str(tmp_path / "cait.onnx"), "--weights", "none", "--top-k", "3"])
    with pytest.raises(SystemExit, match="must be a positive integer"):
        commands.main(["export", str(tmp_path / "latest"), "--weights", "none"])


@pytest.mark.large
def test_the_exporters_are_keras_cait_attributes_that_load_tensorflow_only_when_asked():
    import keras_cait

    assert keras_cait.export_saved_model is export_saved_model
    script = (
        "import sys, keras_cait\n"
        "assert 'tensorflow' not in sys.modules\n"
        "keras_cait.export_onnx\n"
        "assert 'tensorflow' in sys.modules\n"
    )
    process = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "jax"}
    )
    assert process.returncode == 0, process.stderr[-3000:]


def test_every_weight_is_saved_once_with_the_layer_scales_and_patch_bias_folded(saved_model_dir, model):
    reader = tf.train.load_checkpoint(str(saved_model_dir / "variables" / "variables"))
    shapes = reader.get_variable_to_shape_map()
    saved = sum(int(np.prod(shape)) for name, shape in shapes.items() if name != "_CHECKPOINTABLE_OBJECT_GRAPH")
    # The inference graph (keras_cait.export.inference_graph) multiplies each LayerScale into the
    # projection before it and adds the patch bias to the position embedding; the softmax cancels
    # the pre-softmax head mix's bias, so it is left out.
    folded = [weight for weight in model.weights
              if "layer_scale" in weight.path or weight.path == "patch_embedding/projection/bias"
              or "pre_softmax_head_mix/bias" in weight.path]
    assert len(folded) == 2 * 4 + 1 + 2  # two LayerScales in each of the 2 + 2 blocks, 2 mix biases
    kept = [weight for weight in model.weights if not any(weight is f for f in folded)]
    assert saved == sum(int(np.prod(weight.shape)) for weight in kept)


@pytest.mark.large
def test_the_model_s_own_class_names_name_the_top_k(images, tmp_path):
    model = small_model(classes=4)
    model.class_names = ["wolf", "ant", "yak", "emu"]
    loaded = tf.saved_model.load(str(export_saved_model(model, tmp_path / "1", top_k=4)))
    outputs = loaded.signatures["serving_default"](images=tf.constant(images))
    best = np.argsort(-outputs["probabilities"].numpy(), axis=1)
    np.testing.assert_array_equal(outputs["top_k_classes"].numpy().astype(str),
                                  np.array(model.class_names)[best])
    given = ["w", "a", "y", "e"]  # names passed to the call win
    loaded = tf.saved_model.load(str(export_saved_model(model, tmp_path / "2", class_names=given, top_k=1)))
    assert set(loaded.signatures["serving_default"](images=tf.constant(images))["top_k_classes"].numpy()
               .astype(str).ravel()) <= set(given)


def test_precision_the_old_name_of_compute_dtype_still_reaches_it_with_a_deprecation_warning(tmp_path):
    model = small_model()
    # A value compute_dtype refuses: the refusal shows precision= was passed on as compute_dtype.
    with pytest.warns(DeprecationWarning, match=r"export_saved_model\(precision=\.\.\.\) is now compute_dtype") as seen, \
            pytest.raises(ValueError, match=r"^compute_dtype='float64': must be 'float32' or 'bfloat16'"):
        export_saved_model(model, str(tmp_path / "1"), precision="float64")
    assert [warning.filename for warning in seen] == [__file__]  # the caller's line
    with pytest.raises(TypeError, match=r"got precision='bfloat16' and compute_dtype='float32': precision is the "
                                        r"old name of compute_dtype; give compute_dtype alone"):
        export_saved_model(model, str(tmp_path / "1"), precision="bfloat16", compute_dtype="float32")
    assert not (tmp_path / "1").exists()
