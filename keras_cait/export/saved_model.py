"""`export_saved_model`: a TF Serving version folder.

The SavedModel serving contract (tag "serve"); H×W is the model's input size:

    signature         input                                   accepts
    serving_default   images       float32 [batch, H, W, 3]   RGB, values 0..255
    serving_uint8     images       uint8   [batch, H, W, 3]   RGB
    serving_bytes     image_bytes  string  [batch]            JPEG, PNG, GIF, BMP or WebP
                                                              files of up to MAX_PIXELS

    every signature returns
    probabilities        float32 [batch, classes]
    top_k_indices        int32   [batch, k]    best first
    top_k_probabilities  float32 [batch, k]
    top_k_classes        string  [batch, k]    class names

`serving_bytes` decodes each file and applies the reference evaluation
transform (timm, crop_pct 1.0) inside the graph: resized bicubic (antialiased)
keeping the aspect ratio until it covers H×W, centre crop H×W, pixels rounded
to integers as PIL does; it is `keras_cait.images.evaluation_transform`, the code
that `keras_cait.preprocessing.load_image` runs. Its memory is bounded by the
decoded file and H×W whatever the aspect ratio, and files of more than
`evaluation_transform.MAX_PIXELS` (89.5 million) pixels are refused from their header. Inputs of
another shape, with values outside 0..255, or bytes that are no image fail
with INVALID_ARGUMENT and a message naming what was expected. Every input and output is float32,
integer or string whatever the model's dtype policy, and no function needs XLA
(unless exported with `jit_compile=True`), so TF Serving (REST and gRPC) runs the
model as it is, without keras_cait.

What is traced (the folded inference graph of a float32 CaiT classifier, else
the Keras model) is `keras_cait.export.core.inference_form`.

Example:
    export_saved_model(keras_cait.CaiT_S24(weights="imagenet"), "serving/cait_s24/1")
    # then: tensorflow_model_server --rest_api_port=8501 --model_name=cait_s24 \\
    #           --model_base_path=$PWD/serving/cait_s24
"""

import numbers

import keras
import numpy
import tensorflow as tf

from keras_cait.deprecation import renamed_keywords
from keras_cait.errors import ArgumentError, Named, checked_bool
from keras_cait.export.core import (
    check_version_folder, inference_form, loggers_kept, quantized, require_tensorflow_backend,
)
from keras_cait.export.inference_graph import InferenceGraph
from keras_cait.images.evaluation_transform import (
    IMAGE_FORMATS,
    decode_image,
    evaluation_transform,
    has_image_signature,
)
from keras_cait.io.atomic import written_atomically
from keras_cait.models.class_names import checked_class_names, class_count, class_names_of
from keras_cait.models.surgery import check_model_object


@renamed_keywords(precision="compute_dtype")
def export_saved_model(
    model, path, *, top_k=None, class_names=None, from_logits=None, quantization=None, compute_dtype="float32",
    jit_compile=False, overwrite=False,
):
    """Writes `model` as a SavedModel version folder that TF Serving loads as it is.

    Args:
        model: a Keras classifier with one image input `(batch, H, W, 3)` taking
            0..255 RGB and one output `(batch, classes)`, e.g. `CaiT_S24()`.
        path: the version folder, `MODEL_BASE_PATH/<positive integer>`, e.g.
            "serving/cait_s24/1"; TF Serving serves the highest version.
        top_k: how many best classes the `top_k_*` outputs list (default: 5, or every class of
            a model of fewer).
        class_names: the names of the classes in index order; defaults to the
            model's own `class_names` (kept by a model fitted on a folder), else
            the ImageNet names for 1000 classes, and must be given otherwise.
        from_logits: whether the model outputs logits (they get a softmax);
            by default read from the model's last layer activation.
        quantization: None (float), "int8" (every Dense kernel stored as int8
            and its inputs quantised per token), "int4" (kernels as int4, two
            to a byte, inputs int8 per token) or "float8" (Keras' float8:
            kernels and inputs rounded to float8 with scales, kernels kept in
            float32): Keras `model.quantize` on a copy; see docs/export.md for
            each mode's accuracy and size.
        compute_dtype: "float32", or "bfloat16" for CPUs with bfloat16 units
            (AVX512-BF16, AMX) and GPUs: the matmuls compute in bfloat16, the
            residual stream, LayerNorm and softmax in float32, as under timm's
            autocast; the signatures still take and return float32. Needs a
            CaiT classifier (float32, or trained under a mixed policy) without
            `quantization`. (Its old name `precision=` works, with a
            DeprecationWarning, until the next release.)
        jit_compile: compile the model's forward pass with XLA (the decoding
            and the checks around it stay TensorFlow ops). Faster on a CPU at
            small batches (docs/benchmarks.md), but TF Serving runs it only when
            started with `--xla_cpu_compilation_enabled`: without the flag it
            answers every request with an error ("XLA compilation disabled").
        overwrite: replace an existing version folder.

    The folder is written beside `path` under a hidden name and renamed into
    place only when complete, so a failed export leaves nothing TF Serving
    would try to load. Returns `path`.
    """
    require_tensorflow_backend("export_saved_model")
    check_model_object(model, "export_saved_model", inputs=True)
    height, width, classes = _classifier_shape(model)
    _check_takes_pixels(model)
    check_version_folder(path, overwrite)  # the arguments in their order: the model, then the path
    names = _class_names(class_names, model)
    if from_logits is None:
        from_logits = _outputs_logits(model)
    else:  # a str 'no' is truthy: a softmax over probabilities, every score flattened
        from_logits = checked_bool("from_logits", from_logits,
                                   "True (the model outputs logits), False (probabilities) or None (read from its last layer)")
    top_k = min(5, classes) if top_k is None else top_k
    # A str from a config ('5') failed the range check with a TypeError; True was taken as 1.
    if isinstance(top_k, (bool, numpy.bool_)) or not isinstance(top_k, numbers.Integral) or not 1 <= top_k <= classes:
        raise ArgumentError("top_k", top_k, f"must be an integer from 1 to the model's {classes} classes",
                            ["e.g. ", Named("top_k", min(5, classes)), ", or leave it out for that"], usage=True)
    top_k = int(top_k)
    if compute_dtype not in ("float32", "bfloat16"):
        raise ArgumentError("compute_dtype", compute_dtype, "must be 'float32' or 'bfloat16' (CPUs with bfloat16 "
                            "units, and GPUs)", usage=True)
    if compute_dtype != "float32" and quantization is not None:
        raise ArgumentError("compute_dtype", compute_dtype, ["is not taken with ", Named("quantization", quantization),
                            ": bfloat16 computes with float weights"], "choose one", usage=True)
    jit_compile = checked_bool("jit_compile", jit_compile, "True (compile with XLA) or False")
    forward = inference_form(quantized(model, path, quantization), compute_dtype=compute_dtype)
    # XLA compiles the forward pass alone: the strings of the outputs and of serving_bytes are no XLA types.
    compiled = tf.function(forward, jit_compile=True, autograph=False) if jit_compile else forward

    # One traced classifier that the three signatures share: the model is traced once.
    @tf.function(input_signature=[tf.TensorSpec([None, height, width, 3], tf.float32)], jit_compile=False)
    def classify(images):
        scores = keras.ops.cast(compiled(images), "float32")
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
        # TF Serving runs without XLA by default: only `compiled` may require it, and only when asked.
        function = tf.function(function, input_signature=[spec], jit_compile=False, autograph=False)
        function.get_concrete_function()
        archive.add_endpoint(name, function)
    with written_atomically(path, overwrite) as temporary, loggers_kept():
        archive.write_out(temporary, verbose=False)
    return path


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

    known = has_image_signature(image_bytes)
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


# === Checks of the model ===


def _classifier_shape(model):
    """(H, W, classes) of an image classifier, or a ValueError saying what is wrong."""
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ArgumentError("model", None, f"has {len(model.inputs)} inputs and {len(model.outputs)} outputs, but a "
                            "served classifier has one image input and one output", "export the classifier alone",
                            usage=True, shown=f"<{model.name}>")
    input_shape = tuple(model.inputs[0].shape)
    if len(input_shape) != 4 or None in input_shape[1:3] or input_shape[3] != 3:
        raise ArgumentError("model", None, f"takes inputs of shape {input_shape}, but a served classifier takes "
                            "(batch, height, width, 3) with a known height and width",
                            "build it with an input_shape, e.g. (224, 224, 3)", usage=True, shown=f"<{model.name}>")
    names = {layer.name for layer in model.layers}
    if "patch_embedding" in names and not isinstance(model.layers[-1], keras.layers.Dense):  # include_top=False
        raise ArgumentError("model", None, f"outputs {tuple(model.outputs[0].shape)}, features of a CaiT without a "
                            "head, not class scores", "give a classifier: a CaiT built with include_top=True, or "
                            "keras_cait.training.with_new_head(model, classes)", usage=True, shown=f"<{model.name}>")
    return input_shape[1], input_shape[2], class_count(model)


def _check_takes_pixels(model):
    """The signatures hand the model 0..255 pixels, so a CaiT must normalise them itself."""
    names = {layer.name for layer in model.layers}
    if "patch_embedding" in names and "preprocessing" not in names:
        raise ArgumentError("model", None, "was built with include_preprocessing=False, so it expects normalised "
                            "images, but the serving signatures take 0..255 pixels", "build it with "
                            "include_preprocessing=True (the default), load the same weights, then export",
                            usage=True, shown=f"<{model.name}>")


def _class_names(class_names, model):
    """The names of the top_k_classes output: `class_names`, else the model's (`class_names_of`)."""
    names = class_names_of(model) if class_names is None else class_names
    if names is None:
        classes = class_count(model)
        raise ArgumentError(
            "class_names", None, f"the model has {classes} classes and no names of its own (ImageNet's are known "
            "for 1000 classes only), which the top_k_classes output lists",
            ["give ", Named("class_names", shown="[...]"), f" ({classes} names in index order), or name the model's "
             "classes: keras_cait.models.with_class_names(model, [...])"], usage=True)
    return list(checked_class_names(names, model))


def _outputs_logits(model):
    """Whether the model's last layer outputs logits (linear) rather than probabilities."""
    activation = getattr(model.layers[-1], "activation", None)
    if activation is keras.activations.softmax:
        return False
    if activation is keras.activations.linear:
        return True
    raise ArgumentError("from_logits", None, f"is needed: the last layer of {model.name}, "
                        f"{model.layers[-1].name!r}, is neither linear nor softmax, so whether it outputs logits "
                        "or probabilities cannot be told", "give from_logits=False (softmax probabilities) or "
                        "from_logits=True (logits, a softmax is added)", usage=True)
