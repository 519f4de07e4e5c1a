"""One door to a CaiT classifier: what `model=X` means, answered once for every caller.

`load_classifier(model, ...)` takes

    a name        "S24", "cait_s24", "cait_s24_384" (any case; `parse_model_name`): the variant, built
                  with `weights` ("imagenet", None or a file, `checked_weights`) at `image_size`,
                  by default the side of the checkpoint the name loads (`default_image_size`)
    a .keras file a CaiT saved with `model.save`, at its own side unless `image_size` is given
    a keras.Model a CaiT built or loaded before

and `dtype` applies to each: a name is built under it, a file or a model rebuilt under it
(`with_dtype_policy`); the global dtype policy is left as the caller set it. The `keras-cait`
commands, the training runs and keras-hub's presets load through it, so `.pt` checkpoints,
`weights="none"` and a new head's initialiser are the same everywhere.

A mistake is an `ArgumentError` (a ValueError) naming the argument as Python writes it, its
value, what is wrong and what is allowed: `image_size=200: must be a multiple of the patch size
16; e.g. image_size=208`.

Example:
    model = load_classifier("cait_xxs24_224")                    # ImageNet's 1000 classes
    model = load_classifier("runs/flowers/best.keras", dtype="mixed_bfloat16")
    model = load_classifier("XXS24", classes=5)                   # ImageNet backbone, a new 5-class head
"""

import os
import zipfile

import keras

from keras_cait.errors import ArgumentError, Named, checked_bool, quietly_caused
from keras_cait.layers import PatchEmbedding
from keras_cait.layers.initializers import python_generator_kept
from keras_cait.models.architecture import (
    HEAD_NAME,
    POOLING_MODES,
    CaiTModel,
    checked_activation,
    checked_classes,
    checked_drop_path_rate,
)
from keras_cait.models.blocks import ClassAttentionBlock
from keras_cait.models.class_names import class_count
from keras_cait.models.inputs import checked_image_size, image_sides
from keras_cait.models.precision import checked_dtype
from keras_cait.models.surgery import (
    FEATURE_LAYERS,
    at_resolution,
    pooled_features,
    with_drop_path_rate,
    with_dtype_policy,
    with_new_head,
)
from keras_cait.models.variants import (
    IMAGENET_CLASSES, PATCH_SIZE, cait, checked_weights, default_image_size, parse_model_name,
)
from keras_cait.weights import WEIGHT_FILES, head_classes



class _LeftOut(str):
    """A default equal to the value it stands for, and told from that value given by the caller (`is`)."""


# `classifier_activation` left out: a name's head applies softmax, a file's or a model's own head keeps
# its activation; a "softmax" the caller gives is asked of that head too.
SOFTMAX_UNLESS_OWN = _LeftOut("softmax")


def load_classifier(model, *, weights="imagenet", image_size=None, include_top=True, pooling=None, classes=None,
                    classifier_activation=SOFTMAX_UNLESS_OWN, dtype=None, drop_path_rate=None):
    """A CaiT classifier (a `CaiTModel`) from a variant name, a `.keras` file or a Keras model.

    Args:
        model: a variant name ("S24", "cait_s24_384"), the path of a `.keras` file, or a CaiT
            `keras.Model`.
        weights: for a name: "imagenet" (the released checkpoint nearest `image_size`, its
            position embedding resized where the size differs), None (random; "none" too), or
            the path of a .safetensors / .pth / .pt checkpoint (timm's or DeiT's names) or a
            .weights.h5 file. A file or a model holds its own weights: leave `weights` out.
        image_size: the side of the square images it takes, a multiple of 16. Default: for a
            name, the side of the checkpoint it loads (cait_s24_384: 384, S24: 224); for a file
            or a model, its own. A file or a model at another side is rebuilt at this one
            (`at_resolution`).
        include_top: False for its pooled features without the head (`pooling`: "token", the
            class token, or "avg", the patch mean; for a name with None, the token sequence
            `(batch, 1 + patches, width)`).
        pooling: None, "token" or "avg"; a file or a model has the pooling it was built with.
        classes: the classes of the head. Default: the weights' own for a name (1000 for
            "imagenet", a weights file's head), the model's own for a file or a model. Another
            number puts a new head of that many classes on the pooled features (`with_new_head`),
            e.g. to fine-tune.
        classifier_activation: of the head of a name, or of a new head; None gives logits. A file's
            or a model's own head keeps its activation: another, given, is refused (softmax asked
            of a head that gives logits too).
        dtype: the dtype policy it computes in ("float32", "mixed_bfloat16", a
            `keras.DTypePolicy`); None: the global policy for a name, its own for a file or a model.
        drop_path_rate: the stochastic-depth rate of its self-attention blocks, for training;
            None: 0 for a name, its own for a file or a model.

    Returns:
        A `CaiTModel` (with `include_top=False`, the model of its features); a Keras model given
        at its size, policy and head is returned itself.

    Raises:
        `keras_cait.errors.ArgumentError` (a ValueError) naming the argument at fault; a
        `ConnectionError` where the ImageNet checkpoint cannot be fetched.
    """
    check_model(model)
    include_top = checked_bool("include_top", include_top, "True (with the head) or False (its features)")
    if pooling not in POOLING_MODES:
        raise ArgumentError("pooling", pooling, "unknown pooling", f"give one of {', '.join(map(repr, POOLING_MODES))}",
                            usage=True)
    if image_size is not None:
        image_size = checked_image_size(image_size, PATCH_SIZE)
    if classes is not None:
        classes = checked_classes(classes)
    dtype = checked_dtype(dtype)
    if drop_path_rate is not None:
        drop_path_rate = checked_drop_path_rate(drop_path_rate)
    if classes is not None and not include_top:
        raise ArgumentError("classes", classes, "applies to a head, and include_top=False leaves it out",
                            ["leave ", Named("classes"), " out, or give ", Named("include_top", True)], usage=True)
    if isinstance(model, keras.Model) or is_keras_file(model):
        if weights != "imagenet":
            shown = os.fspath(model) if is_keras_file(model) else f"the model {model.name!r}"
            raise ArgumentError("weights", weights, f"applies to a variant name; {shown} holds its own weights",
                                ["leave ", Named("weights"), " out"], usage=True)
        loaded = model if isinstance(model, keras.Model) else read_keras_file(model)
        return _adapted(loaded, model, image_size, include_top, pooling, classes, classifier_activation, dtype,
                        drop_path_rate)
    weights = checked_weights(weights)
    side = image_size or default_image_size(model)
    # The weights' own head: the checkpoint's 1000 classes, a file's (None: it has none); another
    # number given is a new head on the backbone.
    if weights == "imagenet":
        own = IMAGENET_CLASSES
    else:
        own = head_classes(weights) if weights is not None and include_top else None
    new_head = include_top and weights is not None and classes is not None and classes != own
    if classes is None:
        classes = own or IMAGENET_CLASSES
    built = cait(
        model, weights=weights, input_shape=(side, side, 3), include_top=include_top and not new_head,
        pooling="token" if new_head and pooling is None else pooling,
        classes=classes, classifier_activation=classifier_activation,
        drop_path_rate=drop_path_rate or 0.0, dtype=dtype,
    )
    return with_new_head(built, classes, classifier_activation) if new_head else built


def check_model(model, argument="model"):
    """What `load_classifier` refuses of `model` itself, found without reading it: anything but a
    variant name, the path of a `.keras` file or a `keras.Model`; a name no variant has; a .keras
    path that is no file. An `ArgumentError` naming `argument`; a run asks before it reads its data."""
    if isinstance(model, keras.Model):
        return
    if is_keras_file(model):
        check_keras_file(model, argument)
        return
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str):
        raise ArgumentError(argument, model, f"not a name, a path or a model, but of type {type(model).__name__}",
                            "give a variant name (e.g. 'S24', 'cait_s24_384'), the path of a .keras file or a "
                            "keras.Model", usage=True)
    if os.path.isdir(model):  # a run's folder, say: its models are .keras files in it
        inside = [name for name in ("best.keras", "final.keras") if os.path.isfile(os.path.join(model, name))]
        raise ArgumentError(argument, model, "is a folder", [
            "give a .keras model in it, e.g. ", Named(argument, os.path.join(model, inside[0]))] if inside else
            "give a variant name (e.g. 'S24') or the path of a .keras file", usage=not inside)
    try:
        parse_model_name(model, argument=argument)
    except ArgumentError:
        if not (os.path.exists(model) or os.sep in model or "/" in model or "." in model):
            raise
        # a path (no variant name has a dot or a slash): said as one
        checkpoint = model.endswith(WEIGHT_FILES)
        raise ArgumentError(argument, model, "no such file" if not os.path.exists(model) else
                            "is a checkpoint, not a .keras model" if checkpoint else "is not a .keras model",
                            ["give a variant name with the checkpoint, e.g. ", Named("weights", model)]
                            if checkpoint and os.path.isfile(model) else _KERAS_FILE_ALLOWED) from None


def is_keras_file(model):
    """Whether `model` names a `.keras` file (a str or path ending in .keras)."""
    return isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".keras")


def read_keras_file(path, argument="model"):
    """The Keras model saved at `path` (`keras.models.load_model`, keras_cait's layers known), any
    model, not only a CaiT (a distillation's teacher); a missing or unreadable file is an
    `ArgumentError` naming `argument`."""
    path = check_keras_file(path, argument)
    try:
        with python_generator_kept():  # the layers' seeds are drawn, then the file's weights set
            return keras.models.load_model(path)
    except (OSError, ValueError, TypeError, KeyError) as error:  # KeyError: a zip archive without config.json
        text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        raise quietly_caused(ArgumentError(argument, path, f"is not a readable .keras model: {first}",
                                           _KERAS_FILE_ALLOWED), error) from None


def check_keras_file(path, argument="model"):
    """`path` as a str, after checking that it is a file in the .keras format (a zip archive); else an
    `ArgumentError` naming `argument`. Nothing is loaded."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ArgumentError(argument, path, "is a folder" if os.path.isdir(path) else "no such file",
                            _KERAS_FILE_ALLOWED)
    if not zipfile.is_zipfile(path):
        raise ArgumentError(argument, path, "is not a .keras model (a .keras file is a zip archive)",
                            _KERAS_FILE_ALLOWED)
    return path


_KERAS_FILE_ALLOWED = "give a model saved with model.save('name.keras'), or a CaiT variant name"


def is_cait(model):
    """Whether `model` is a functional CaiT: a patch embedding and class-attention blocks among its layers."""
    layers = getattr(model, "layers", ())
    return any(isinstance(layer, PatchEmbedding) for layer in layers) and any(
        isinstance(layer, ClassAttentionBlock) for layer in layers)


def image_side(model, argument="model", value=None):
    """The side of the square images `model` takes; an `ArgumentError` naming `argument` (its
    `value`, default the model) for a model of other inputs or of oblong images."""
    value = model if value is None else value
    shown = None if isinstance(value, (str, os.PathLike)) else f"<model {model.name!r}>"
    _check_takes_images(model, argument, value, shown)
    height, width = image_sides(model)
    if height != width:
        raise ArgumentError(argument, value, f"takes {height}x{width} images, not square ones",
                            ["give ", Named("image_size"), " for a square size to run it at"], shown=shown)
    return height


def _check_takes_images(model, argument, value, shown):
    shape = model.input_shape
    if not isinstance(shape, tuple) or len(shape) != 4:
        raise ArgumentError(argument, value, f"takes inputs of shape {shape}, not images (batch, height, width, 3)",
                            "give an image classifier: a CaiT saved as .keras, or a CaiT variant name", shown=shown)


def _adapted(loaded, model, image_size, include_top, pooling, classes, activation, dtype, drop_path_rate):
    """A loaded file's (or a given) model at `image_size`, under `dtype`, with the head asked for."""
    shown = None if isinstance(model, (str, os.PathLike)) else f"<model {loaded.name!r}>"
    value = os.fspath(model) if shown is None else model
    _check_takes_images(loaded, "model", value, shown)
    if not is_cait(loaded):
        raise ArgumentError("model", value, f"holds {loaded.name!r}, not a CaiT (no patch embedding and "
                            "class-attention blocks)", ["give a CaiT saved as .keras (e.g. best.keras of a finetune "
                            "run) or a variant name, e.g. ", Named("model", "XXS24")], shown=shown)
    adapted = loaded
    if dtype is not None:
        adapted = with_dtype_policy(adapted, dtype)
    if drop_path_rate is not None:
        adapted = with_drop_path_rate(adapted, drop_path_rate)
    if image_size is not None and tuple(image_sides(adapted)) != (image_size, image_size):
        adapted = at_resolution(adapted, image_size)
    if not include_top:
        return _features(adapted, pooling, value, shown)
    # A CaiT saved with include_top=False and pooling outputs (batch, width) too: its pooled features, not
    # class scores (it was taken for a classifier of `width` classes).
    headless = adapted.layers[-1].name in FEATURE_LAYERS
    own = class_count(adapted) if len(adapted.outputs[0].shape) == 2 and not headless else None
    if classes is not None and classes != own:
        return with_new_head(adapted, classes, activation, name=adapted.name)
    if own is None:
        raise ArgumentError("model", value, f"outputs {tuple(adapted.outputs[0].shape)}, "
                            + (f"its {adapted.layers[-1].name} features (it has no head)" if headless else
                               "not class scores (batch, classes)"),
                            ["give ", Named("classes", shown="N"), " for a new head, or ", Named("include_top", False),
                             " for its features"] if headless else
                            ["give a classifier, or ", Named("include_top", False), " for its features"], shown=shown)
    _check_own_activation(adapted, activation)
    if pooling is not None and pooled_features(adapted).name != f"{pooling}_pool":
        raise ArgumentError("pooling", pooling, f"the model's head reads its {pooled_features(adapted).name}",
                            ["leave ", Named("pooling"), " out"], usage=True)
    return adapted if isinstance(adapted, CaiTModel) else CaiTModel(adapted.inputs, adapted.outputs,
                                                                    name=adapted.name)


def _check_own_activation(model, activation):
    """`classifier_activation` of a file or a model kept with its own head: the default, or the head's own
    activation; another (None for logits) was ignored, the head's applied. An `ArgumentError` naming it."""
    if activation is SOFTMAX_UNLESS_OWN or HEAD_NAME not in [layer.name for layer in model.layers]:
        return
    wanted = checked_activation(activation)
    own = model.get_layer(HEAD_NAME).activation
    if wanted is not own:
        raise ArgumentError("classifier_activation", activation, f"applies to a variant name or a new head; the "
                            f"model's head keeps its own activation {getattr(own, '__name__', own)!r}",
                            ["leave ", Named("classifier_activation"), " out, or give ", Named("classes"),
                             " for a new head"], usage=True)


def _features(model, pooling, value, shown):
    """`model` without its head: the output of its pooled features, `pooling` or whichever it has."""
    features = pooled_features(model, argument="model")
    if pooling is not None and features.name != f"{pooling}_pool":
        raise ArgumentError("pooling", pooling, f"the model pools its features with {features.name} "
                            f"({FEATURE_LAYERS[0]}: 'token', {FEATURE_LAYERS[1]}: 'avg')",
                            ["leave ", Named("pooling"), " out"], usage=True)
    return keras.Model(model.inputs, features.output, name=model.name)
