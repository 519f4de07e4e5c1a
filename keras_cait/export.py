"""Exports a CaiT classifier for serving: TF Serving SavedModel, ONNX, LiteRT, OpenVINO.

This module is TensorFlow by nature (SavedModel signatures, tf.image, TFLite);
the model code it exports stays backend-neutral.

The SavedModel serving contract (tag "serve"); H×W is the model's input size:

    signature         input                                   accepts
    serving_default   images       float32 [batch, H, W, 3]   RGB, values 0..255
    serving_uint8     images       uint8   [batch, H, W, 3]   RGB
    serving_bytes     image_bytes  string  [batch]            JPEG, PNG, GIF or BMP
                                                              files of up to MAX_PIXELS

    every signature returns
    probabilities        float32 [batch, classes]
    top_k_indices        int32   [batch, k]    best first
    top_k_probabilities  float32 [batch, k]
    top_k_classes        string  [batch, k]    class names

`serving_bytes` decodes each file and applies the reference evaluation
transform (timm, crop_pct 1.0) inside the graph: resized bicubic (antialiased)
keeping the aspect ratio until it covers H×W, centre crop H×W, pixels rounded
to integers as PIL does; it is `keras_cait.evaluation_transform`, the code
that `keras_cait.preprocessing.load_image` runs. Its memory is bounded by the
decoded file and H×W whatever the aspect ratio, and files of more than
`evaluation_transform.MAX_PIXELS` (89.5 million) pixels are refused from their header. Inputs of
another shape, with values outside 0..255, or bytes that are no image fail
with INVALID_ARGUMENT and a message naming what was expected. Every input and output is float32,
integer or string whatever the model's dtype policy, and no function needs XLA,
so TF Serving (REST and gRPC) runs the model as it is, without keras_cait.

A float32 CaiT classifier is exported as its inference graph
(`keras_cait.inference_graph`): the same outputs, with the normalisation,
LayerScale and attention scale folded into the weights and a graph that
oneDNN fuses (MatMul+BiasAdd+GELU, LayerNorm); any other model (mixed
precision, int8, other heads) as the Keras model itself.

Example:
    export_saved_model(keras_cait.CaiT_S24(weights="imagenet"), "serving/cait_s24/1")
    # then: tensorflow_model_server --rest_api_port=8501 --model_name=cait_s24 \\
    #           --model_base_path=$PWD/serving/cait_s24
"""

import functools
import importlib.util
import os
import re

import keras
import numpy as np
import tensorflow as tf

from keras_cait.atomic import written_atomically
from keras_cait.evaluation_transform import IMAGE_FORMATS, decode_image, evaluation_transform
from keras_cait.inference_graph import InferenceGraph, folds
from keras_cait.preprocessing import imagenet_classes
from keras_cait.training.lora import merge_lora

QUANTIZATIONS = (None, "dynamic_int8")
# Keras' own `model.quantize` modes that the SavedModel export takes (docs/export.md).
KERAS_QUANTIZATIONS = (None, "int8", "int4", "float8")
# ... and the ONNX export: tf2onnx unpacks int4 kernels to float32 and has no float8.
ONNX_QUANTIZATIONS = (None, "int8")


def export_saved_model(
    model, path, *, top_k=5, class_names=None, from_logits=None, quantization=None, overwrite=False
):
    """Writes `model` as a SavedModel version folder that TF Serving loads as it is.

    Args:
        model: a Keras classifier with one image input `(batch, H, W, 3)` taking
            0..255 RGB and one output `(batch, classes)`, e.g. `CaiT_S24()`.
        path: the version folder, `MODEL_BASE_PATH/<positive integer>`, e.g.
            "serving/cait_s24/1"; TF Serving serves the highest version.
        top_k: how many best classes the `top_k_*` outputs list.
        class_names: the names of the classes in index order; defaults to the
            ImageNet names for 1000 classes and must be given otherwise.
        from_logits: whether the model outputs logits (they get a softmax);
            by default read from the model's last layer activation.
        quantization: None (float), "int8" (every Dense kernel stored as int8
            and its inputs quantised per token), "int4" (kernels as int4, two
            to a byte, inputs int8 per token) or "float8" (Keras' float8:
            kernels and inputs rounded to float8 with scales, kernels kept in
            float32): Keras `model.quantize` on a copy; see docs/export.md for
            each mode's accuracy and size.
        overwrite: replace an existing version folder.

    The folder is written beside `path` under a hidden name and renamed into
    place only when complete, so a failed export leaves nothing TF Serving
    would try to load. Returns `path`.
    """
    _require_tensorflow_backend("export_saved_model")
    height, width, classes = _classifier_shape(model)
    _check_takes_pixels(model)
    names = _class_names(class_names, classes)
    if from_logits is None:
        from_logits = _outputs_logits(model)
    if not 1 <= top_k <= classes:
        raise ValueError(f"top_k={top_k}: must be between 1 and the {classes} classes, e.g. 5.")
    _check_version_folder(path, overwrite)
    forward = _inference_form(_quantized(model, path, quantization))

    # One traced classifier that the three signatures share: the model is traced once.
    @tf.function(input_signature=[tf.TensorSpec([None, height, width, 3], tf.float32)], jit_compile=False)
    def classify(images):
        scores = keras.ops.cast(forward(images), "float32")
        probabilities = tf.nn.softmax(scores) if from_logits else scores
        top_probabilities, top_indices = tf.math.top_k(probabilities, k=top_k)
        return {
            "probabilities": probabilities,
            "top_k_indices": top_indices,
            "top_k_probabilities": top_probabilities,
            "top_k_classes": tf.gather(tf.constant(names), top_indices),
        }

    def serving_default(images):
        return classify(_checked_images(images, height, width, "serving_default"))

    def serving_uint8(images):
        images = _checked_images(images, height, width, "serving_uint8")
        return classify(tf.cast(images, tf.float32))

    def serving_bytes(image_bytes):
        return classify(_decode_and_crop(image_bytes, height, width))

    image_shape = [None, height, width, 3]
    endpoints = {
        "serving_default": (serving_default, tf.TensorSpec(image_shape, tf.float32, name="images")),
        "serving_uint8": (serving_uint8, tf.TensorSpec(image_shape, tf.uint8, name="images")),
        "serving_bytes": (serving_bytes, tf.TensorSpec([None], tf.string, name="image_bytes")),
    }
    archive = keras.export.ExportArchive()
    if isinstance(forward, InferenceGraph):
        archive.track(forward)
    for name, (function, spec) in endpoints.items():
        # TF Serving runs without XLA by default, so nothing may require it.
        function = tf.function(function, input_signature=[spec], jit_compile=False, autograph=False)
        function.get_concrete_function()
        archive.add_endpoint(name, function)
    with written_atomically(path, overwrite) as temporary:
        archive.write_out(temporary, verbose=False)
    return path


def export_onnx(model, path, *, quantization=None, overwrite=False, opset_version=None):
    """Writes `model` as an ONNX file: input `images`, output `predictions`.

    `images` is `(batch, H, W, 3)` float32 RGB 0..255 and `predictions` is what
    the model outputs (probabilities, or logits with
    `classifier_activation=None`). Needs `pip install "keras-cait[onnx]"`.

    A float32 CaiT classifier is written as its folded inference graph
    (`keras_cait.inference_graph`: normalisation, LayerScale and attention
    scale folded into the weights, LayerNorm and GELU in the forms ONNX Runtime
    fuses). Any other model is exported as Keras' `model.export(path,
    format="onnx")` does on the TensorFlow backend (tf2onnx's public `from_function` on the traced model),
    with two fixes that export needs for CaiT: the mean and variance of Keras'
    `Normalization` are eager tensors that the traced function captures, which
    tf2onnx would turn into extra required graph inputs, so the exported copy
    of the model normalises with a `Rescaling` layer of the same constants
    (`keras.models.clone_model`, sharing every weight); and TensorFlow's exact
    GELU is `0.5·x·erfc(-x/√2)`, whose Erfc tf2onnx cannot convert, so it is
    taught erfc(x) = 1 - erf(x).

    `quantization="int8"` exports Keras' int8 model (`model.quantize`, on a
    copy): int8 kernels, dequantised inside the graph.
    """
    _require_tensorflow_backend("export_onnx")
    _check_file(path, ".onnx", overwrite)
    model = _quantized(model, path, quantization)
    import tf2onnx

    _register_erfc_for_tf2onnx()
    forward = _inference_form(model, runtime="onnx")
    if not isinstance(forward, InferenceGraph):
        exported = keras.models.clone_model(model, clone_function=_normalization_as_rescaling)
        forward = functools.partial(exported, training=False)
    spec = tf.TensorSpec(model.inputs[0].shape, tf.float32, name="images")
    with written_atomically(path, overwrite) as temporary:
        tf2onnx.convert.from_function(
            tf.function(lambda images: {"predictions": forward(images)}),
            input_signature=[spec],
            opset=opset_version,
            output_path=temporary,
        )
    return path


def _normalization_as_rescaling(layer):
    """`Normalization(mean, variance)` -> the same affine map as `Rescaling`; other layers as they are.

    Rescaling keeps its constants as Python numbers, which the traced graph
    holds as constants rather than as captured tensors.
    """
    if not isinstance(layer, keras.layers.Normalization):
        return layer
    config = layer.get_config()
    if config.get("invert") or config.get("mean") is None:
        return layer
    std = np.sqrt(np.maximum(np.asarray(config["variance"], "float64"), 0.0))
    std = np.maximum(std, keras.backend.epsilon())
    mean = np.asarray(config["mean"], "float64")
    return keras.layers.Rescaling(
        scale=(1.0 / std).tolist(), offset=(-mean / std).tolist(), name=layer.name, dtype=layer.dtype_policy
    )


def export_litert(model, path, *, quantization=None, overwrite=False):
    """Writes `model` as a LiteRT (TFLite) flatbuffer.

    A float32 CaiT classifier is converted as its folded inference graph
    (`keras_cait.inference_graph`), any other model with Keras'
    `model.export(format="litert")`.

    Args:
        model: the Keras model; its input `(batch, H, W, 3)` float32 0..255.
        path: the `.tflite` file to write.
        quantization: None (float32) or "dynamic_int8": weights stored as int8,
            activations computed in float (TFLite dynamic-range quantisation,
            about 4× smaller; see docs/export.md for its top-1 agreement).
        overwrite: replace an existing file.
    """
    _require_tensorflow_backend("export_litert")
    _check_file(path, ".tflite", overwrite)
    _check_quantization(path, quantization)
    converter_options = {}
    if quantization == "dynamic_int8":
        converter_options["optimizations"] = [tf.lite.Optimize.DEFAULT]
    forward = _inference_form(model)
    with written_atomically(path, overwrite) as temporary:
        if not isinstance(forward, InferenceGraph):
            model.export(temporary, format="litert", verbose=False, **converter_options)
            return path
        converter = tf.lite.TFLiteConverter.from_concrete_functions([_traced(forward, model)], forward)
        for name, value in converter_options.items():
            setattr(converter, name, value)
        with open(temporary, "wb") as file:
            file.write(converter.convert())
    return path


def export_openvino(model, path, *, quantization=None, overwrite=False):
    """Writes `model` as OpenVINO IR with Keras' `model.export(format="openvino")`.

    `path` (`.xml`, the graph) and the weights beside it (the same name with
    `.bin`); input `images` `(batch, H, W, 3)` float32 RGB 0..255, one output
    (`predictions` for a CaiT classifier): what the model outputs. A float32
    CaiT classifier is written as its folded inference graph
    (`keras_cait.inference_graph`), any other model as Keras exports it.
    Needs `pip install "keras-cait[openvino]"`.

    OpenVINO's CPU plugin computes in bfloat16 where the CPU has it (AVX512-BF16,
    AMX) unless the model is compiled with `{"INFERENCE_PRECISION_HINT": "f32"}`;
    docs/export.md gives the difference to Keras for both.

    Example:
        export_openvino(model, "cait.xml")
        compiled = openvino.Core().compile_model("cait.xml", "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        probabilities = compiled(images)[0]
    """
    _require_tensorflow_backend("export_openvino")
    _check_file(path, ".xml", overwrite)
    weights_path = os.fspath(path).removesuffix(".xml") + ".bin"
    _check_file(weights_path, ".bin", overwrite)
    _check_quantization(path, quantization)
    if importlib.util.find_spec("openvino") is None:
        raise ImportError('export_openvino needs OpenVINO: pip install "keras-cait[openvino]".')
    import openvino

    forward = _inference_form(model, runtime="onnx")
    # The weights are moved into place first, so a new graph never meets old weights.
    with written_atomically(path, overwrite) as temporary, written_atomically(
        weights_path, overwrite
    ) as temporary_weights:
        if isinstance(forward, InferenceGraph):
            converted = openvino.convert_model(_traced(forward, model))
            (images,), (predictions,) = converted.inputs, converted.outputs
            images.get_node().set_friendly_name("images")
            images.get_tensor().set_names({"images"})
            predictions.get_tensor().set_names({"predictions"})
            openvino.save_model(converted, temporary, compress_to_fp16=False)
        else:
            model.export(temporary, format="openvino", verbose=False)
        os.replace(temporary.removesuffix(".xml") + ".bin", temporary_weights)
    return path


def _inference_form(model, runtime="tensorflow"):
    """What an export traces: the folded `InferenceGraph` of a float32 CaiT classifier (the same
    outputs, fewer and fusable ops), or else the Keras model itself, called for inference.
    """
    if folds(model):
        return InferenceGraph(model, runtime=runtime)
    return functools.partial(model, training=False)


def _traced(forward, model):
    """`forward` as a concrete function of `images` float32 (batch, H, W, 3)."""
    spec = tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.float32, name="images")
    return tf.function(forward, input_signature=[spec], autograph=False).get_concrete_function()


def _quantized(model, path, quantization):
    """`model`, or its Keras-quantised copy (`model.quantize` on every Dense); `model` itself is kept."""
    _check_quantization(path, quantization)
    if quantization is None:
        return model
    copy = merge_lora(model)
    # Dense layers only: Keras would also visit layers it cannot quantise and warn for each.
    copy.quantize(quantization, filters=lambda layer: isinstance(layer, keras.layers.Dense))
    return copy


# === Serving graph pieces ===


def _checked(tensor, condition, message_parts):
    """`tensor`, released only once `condition` holds; else INVALID_ARGUMENT with the message.

    Every op after the check depends on it, so a bad input fails here with the
    message rather than later inside the model with an obscure one.
    """
    check = tf.debugging.Assert(condition, [tf.strings.join(message_parts)], summarize=1)
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def _shape_text(tensor):
    """The dynamic shape of `tensor` as text, e.g. "1, 224, 224, 3".

    Shapes are checked as text because tf.rank / tf.size would be folded to
    constants from the signature's static shape at trace time, while TF Serving
    feeds tensors of any shape without checking them against the signature.
    """
    return tf.strings.reduce_join(tf.strings.as_string(tf.shape(tensor)), separator=", ")


def _checked_images(images, height, width, signature):
    """`images` once its shape is [batch, height, width, 3] and its values are in 0..255."""
    shape = _shape_text(images)
    images = _checked(
        images,
        tf.strings.regex_full_match(shape, rf"\d+, {height}, {width}, 3"),
        [
            f"{signature}: `images` must be RGB images of shape [batch, {height}, {width}, 3]; got [",
            shape,
            f"]. Resize and centre-crop to {height}×{width} first, or send the encoded files "
            "to the serving_bytes signature.",
        ],
    )
    if images.dtype == tf.uint8:
        return images
    return _checked(
        images,
        # `x >= 0` is False for NaN, so NaN fails too.
        tf.reduce_all((images >= 0) & (images <= 255)),
        [
            f"{signature}: `images` values must be 0..255 (not normalised); got min ",
            tf.strings.as_string(tf.reduce_min(images)),
            ", max ",
            tf.strings.as_string(tf.reduce_max(images)),
            ".",
        ],
    )


def _decode_and_crop(image_bytes, height, width):
    """Encoded image files [batch] -> float32 [batch, height, width, 3], the evaluation transform."""
    shape = _shape_text(image_bytes)
    image_bytes = _checked(
        image_bytes,
        tf.strings.regex_full_match(shape, r"\d+"),
        ["serving_bytes: `image_bytes` must be a list [batch] of encoded image files; got shape [", shape, "]."],
    )

    def starts_with(magic):
        return tf.equal(tf.strings.substr(image_bytes, 0, len(magic)), magic)

    known = starts_with(b"\xff\xd8\xff") | starts_with(b"\x89PNG") | starts_with(b"GIF8") | starts_with(b"BM")
    image_bytes = _checked(
        image_bytes,
        tf.reduce_all(known),
        [
            f"serving_bytes: `image_bytes` must be {IMAGE_FORMATS} files; entries [",
            tf.strings.reduce_join(tf.strings.as_string(tf.where(~known)[:, 0]), separator=", "),
            "] are not. Send the bytes of each file (over REST base64-encoded as {\"b64\": ...}).",
        ],
    )

    def decode_one(encoded):
        return evaluation_transform(decode_image(encoded), (height, width))

    return tf.map_fn(
        decode_one, image_bytes, fn_output_signature=tf.TensorSpec([height, width, 3], tf.float32)
    )


# === Checks of the model and the paths ===


def _require_tensorflow_backend(function):
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"{function} writes TensorFlow graphs and needs the TensorFlow backend; the backend "
            f"is {keras.backend.backend()!r}. Save the weights (model.save_weights) and export "
            "from a process started with KERAS_BACKEND=tensorflow."
        )


def _classifier_shape(model):
    """(H, W, classes) of an image classifier, or a ValueError saying what is wrong."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError(
            f"{model.name}: a served classifier needs one image input and one output; it has "
            f"{len(model.inputs)} inputs and {len(model.outputs)} outputs."
        )
    input_shape, output_shape = tuple(model.inputs[0].shape), tuple(model.outputs[0].shape)
    if len(input_shape) != 4 or None in input_shape[1:3] or input_shape[3] != 3:
        raise ValueError(
            f"{model.name}: the input shape {input_shape} must be (batch, height, width, 3) "
            "with a known height and width, e.g. (None, 224, 224, 3)."
        )
    if len(output_shape) != 2:
        raise ValueError(
            f"{model.name}: the output shape {output_shape} must be (batch, classes); build the "
            "model with include_top=True (a classification head)."
        )
    return input_shape[1], input_shape[2], output_shape[1]


def _check_takes_pixels(model):
    """The signatures hand the model 0..255 pixels, so a CaiT must normalise them itself."""
    names = {layer.name for layer in model.layers}
    if "patch_embedding" in names and "preprocessing" not in names:
        raise ValueError(
            f"{model.name} was built with include_preprocessing=False, so it expects normalised "
            "images, but the serving signatures take 0..255 pixels. Build it with "
            "include_preprocessing=True (the default) and load the same weights, then export."
        )


def _class_names(class_names, classes):
    if class_names is None:
        if classes != 1000:
            raise ValueError(
                f"The model has {classes} classes; pass class_names=[...] ({classes} names in "
                "index order) for the top_k_classes output. ImageNet names are only known "
                "for 1000 classes."
            )
        return [name for _, name in imagenet_classes()]
    class_names = [str(name) for name in class_names]
    if len(class_names) != classes:
        raise ValueError(
            f"class_names has {len(class_names)} names but the model has {classes} classes; "
            "give one name per class, in index order."
        )
    return class_names


def _outputs_logits(model):
    """Whether the model's last layer outputs logits (linear) rather than probabilities."""
    activation = getattr(model.layers[-1], "activation", None)
    if activation is keras.activations.softmax:
        return False
    if activation is keras.activations.linear:
        return True
    raise ValueError(
        f"{model.name}: cannot tell whether the last layer {model.layers[-1].name!r} outputs "
        "probabilities or logits; pass from_logits=False (softmax probabilities) or "
        "from_logits=True (logits, a softmax is added)."
    )


def check_destination(path, overwrite=False, quantization=None):
    """Raises unless an export may write `path`; cheap, so callers check before building a model.

    A path ending in `.onnx`, `.tflite` or `.xml` is a file for `export_onnx` /
    `export_litert` / `export_openvino`; anything else is a SavedModel version folder,
    `MODEL_BASE_PATH/<positive integer>`. An existing destination is refused
    unless `overwrite`, and a `quantization` that the format does not take.
    """
    _check_quantization(path, quantization)
    for suffix in (".onnx", ".tflite", ".xml"):
        if os.fspath(path).endswith(suffix):
            return _check_file(path, suffix, overwrite)
    return _check_version_folder(path, overwrite)


def _check_quantization(path, quantization):
    """Raises unless the export to `path` (the format from its suffix) takes `quantization`."""
    path = os.fspath(path)
    if path.endswith(".xml") and quantization is not None:
        raise ValueError(
            f"quantization={quantization!r}: the OpenVINO export is float only, since Keras' int8 "
            "model does not convert to OpenVINO correctly; export the float model and compress it "
            "with OpenVINO's NNCF (nncf.compress_weights), or use int8 with a SavedModel or ONNX."
        )
    if path.endswith(".tflite") and quantization == "int8":
        raise ValueError(
            "quantization='int8': Keras' int8 model does not convert to LiteRT (TFLite's "
            "fully_connected takes no int8 activations); use quantization='dynamic_int8', "
            "TFLite's own int8 weights."
        )
    if path.endswith(".onnx") and quantization not in ONNX_QUANTIZATIONS:
        raise ValueError(
            f"quantization={quantization!r}: must be one of {ONNX_QUANTIZATIONS}, e.g. 'int8', for "
            "ONNX (tf2onnx unpacks int4 kernels to float32, no smaller than float, and has no "
            "float8); export a SavedModel for 'int4' or 'float8'."
        )
    allowed = QUANTIZATIONS if path.endswith(".tflite") else KERAS_QUANTIZATIONS
    if not path.endswith(".xml") and quantization not in allowed:
        smaller = " or ".join(repr(mode) for mode in allowed[2:])
        raise ValueError(
            f"quantization={quantization!r}: must be one of {allowed[:2]}, e.g. {allowed[1]!r}"
            + (f", or Keras' smaller {smaller}." if smaller else ".")
        )


def _check_version_folder(path, overwrite):
    path = os.fspath(path)
    base, version = os.path.split(os.path.normpath(path))
    if not re.fullmatch(r"[1-9][0-9]*", version):
        canonical = version.isascii() and version.isdigit() and int(version) > 0
        example = os.path.join(base, str(int(version))) if canonical else os.path.join(path, "1")
        raise ValueError(
            f"path {path!r}: TF Serving loads numbered version folders, so the last folder "
            f"must be a positive integer without leading zeros, e.g. {example!r}."
        )
    numbered = [name for name in os.listdir(base or ".") if name.isdigit()] if os.path.isdir(base or ".") else []
    twins = [name for name in numbered if int(name) == int(version) and name != version]
    if twins:
        raise FileExistsError(
            f"path {path!r}: TF Serving reads {os.path.join(base, twins[0])!r} as the same version "
            f"{int(version)}; remove or renumber that folder, or export to another version."
        )
    if os.path.exists(path) and not overwrite:
        newest = max(int(name) for name in numbered)
        raise FileExistsError(
            f"Version folder {path!r} exists; export to {os.path.join(base, str(newest + 1))!r} "
            "(TF Serving serves the highest version), or pass overwrite=True "
            "(keras-cait export --overwrite) to replace it."
        )


def _check_file(path, suffix, overwrite):
    path = os.fspath(path)
    if not path.endswith(suffix):
        raise ValueError(f"path {path!r} must end in {suffix}, e.g. cait{suffix}.")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(
            f"{path!r} exists; pass overwrite=True (keras-cait export --overwrite) to replace it."
        )


# === ONNX conversion of TensorFlow's GELU ===


@functools.cache
def _register_erfc_for_tf2onnx():
    """Teaches tf2onnx Erfc (in tf.nn.gelu) as 1 - Erf."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):  # ONNX has Erf from opset 9
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            one = ctx.make_const(utils.make_name("erfc_one"), np.array(1, dtype=dtype))
            node.type = "Erf"
            ctx.insert_new_node_on_output(
                "Sub", node.output[0], name=utils.make_name(node.name), inputs=[one.output[0], node.output[0]]
            )
