"""Intermediate features of a CaiT: the outputs of chosen self-attention blocks.

Modelled on timm's `Cait.forward_intermediates`. The self-attention blocks keep
one token per patch, so block i's output is a feature map of the patch grid:

    x_0 = patches + pos_embed,    x_i = SA_i(x_{i-1}),    feature_i = [norm](x_i)

as `(batch, rows*cols, channels)` ("NLC", timm's "NLC") or `(batch, rows, cols,
channels)` ("NHWC", timm's "NCHW" with channels last). `norm=True` applies the
model's final LayerNorm to each, as timm does. The class token joins only in
the class-attention stage, so it is in none of these.

`feature_extractor` builds a functional Keras model from the images to the
chosen features whose layers ARE the model's layers (same variables: nothing
to keep in sync after fine-tuning). It ends at the last block asked for (timm's
`stop_early`), and saves and exports as any Keras model (`.keras`,
`model.export(...)`, a TF Serving SavedModel with `format="tf_saved_model"`).

    extractor = feature_extractor(model, indices=[3, 7, 11], output_format="NHWC")
    maps = extractor(images)                   # 3 arrays (batch, 14, 14, 384)
    final, maps = forward_intermediates(model, images, indices=2, norm=True)
"""

import collections.abc
import weakref

import keras
import numpy as np

from keras_cait.errors import ArgumentError, checked_bool
from keras_cait.layers import PositionEmbedding
from keras_cait.models.blocks import SelfAttentionBlock
from keras_cait.models.inputs import check_images
from keras_cait.models.surgery import check_model_object

OUTPUT_FORMATS = ("NLC", "NHWC")

# model -> {arguments: the model that forward_intermediates calls}. Weak keys: the
# cache does not keep a deleted model (and its weights) alive.
_INTERMEDIATE_MODELS = weakref.WeakKeyDictionary()


def _take_indices(indices, depth):
    """Block indices in block order: an int n takes the last n, a list the ones named."""
    if indices is None:
        indices = depth
    if isinstance(indices, (bool, np.bool_)) or not isinstance(indices, (int, np.integer, collections.abc.Iterable)) \
            or isinstance(indices, str):
        raise ArgumentError(
            "indices", indices, "not a block index", "give an integer n for the last n blocks (e.g. 4), "
            "a list of block indices (e.g. [0, -1]), or None for every block", usage=True)
    if isinstance(indices, (int, np.integer)):
        if not 0 < indices <= depth:
            raise ArgumentError(
                "indices", indices, "an integer takes the last n blocks, so it must be "
                f"from 1 to the model's {depth} self-attention blocks, e.g. 4", usage=True)
        return list(range(depth - int(indices), depth))
    taken = set()
    for index in indices:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) \
                or not -depth <= index < depth:
            raise ArgumentError(
                "indices", indices, f"{index!r} is not a block index", f"the model has "
                f"{depth} self-attention blocks, so use integers from {-depth} to "
                f"{depth - 1} (negative counts from the last), or an integer n for the last n", usage=True)
        taken.add(int(index) % depth)
    if not taken:
        raise ArgumentError("indices", indices, "name at least one block, e.g. [-1]", usage=True)
    return sorted(taken)


def _checked_output_format(output_format):
    """`output_format` as one of `OUTPUT_FORMATS`, in any case ('nhwc' is "NHWC"), or an `ArgumentError`."""
    if isinstance(output_format, str) and output_format.upper() in OUTPUT_FORMATS:
        return output_format.upper()
    raise ArgumentError("output_format", output_format, f"must be one of {OUTPUT_FORMATS}",
                        "'NLC' for (batch, tokens, channels) or 'NHWC' for (batch, rows, cols, channels)", usage=True)


def _tapped(model, indices, norm, output_format):
    """`model`'s graph replayed: (inputs, the model's outputs, [features in block order])."""
    checked_bool("norm", norm, "True (the final LayerNorm applied to each feature) or False")
    output_format = _checked_output_format(output_format)
    blocks = [layer for layer in model.layers if isinstance(layer, SelfAttentionBlock)]
    if not blocks:
        raise ArgumentError("model", None, "has no SelfAttentionBlock, so it is no CaiT",
                            "give a CaiT built by build_cait or CaiT_* (not a model that wraps one)", usage=True,
                            shown=f"<{model.name}>")
    taken = {blocks[i].name: i for i in _take_indices(indices, len(blocks))}
    rows, cols = next(
        layer.grid_size for layer in model.layers if isinstance(layer, PositionEmbedding)
    )
    final_norm = model.get_layer("final_norm")
    features = {}

    def call(layer, *args, **kwargs):
        outputs = layer(*args, **kwargs)
        if layer.name in taken:
            feature = final_norm(outputs) if norm else outputs
            if output_format == "NHWC":
                feature = keras.layers.Reshape(
                    (rows, cols, feature.shape[-1]), name=f"{layer.name}_grid"
                )(feature)
            features[taken[layer.name]] = feature
        return outputs

    # Replayed with the model's own layers (clone_function returns each as it
    # is), tapping the blocks on the way; an uncompiled view, as clone_model
    # would otherwise compile the replay like the original.
    view = keras.Model(model.inputs, model.outputs)
    replay = keras.models.clone_model(view, clone_function=lambda layer: layer, call_function=call)
    inputs = replay.inputs[0] if len(replay.inputs) == 1 else replay.inputs
    outputs = replay.outputs[0] if len(replay.outputs) == 1 else replay.outputs
    return inputs, outputs, [features[i] for i in sorted(features)]


def feature_extractor(model, indices=None, norm=False, output_format="NLC", name=None):
    """A Keras model from `model`'s images to the outputs of chosen self-attention blocks.

    Args:
        model: a CaiT from `build_cait` or a `CaiT_*` constructor, with or without
            its top.
        indices: None (every block), an int n (the last n blocks), or a list of
            block indices (negative counts from the last). The features come in
            block order, each block once, as in timm.
        norm: apply the model's final LayerNorm to each feature.
        output_format: "NLC" for `(batch, rows*cols, channels)` or "NHWC" for
            `(batch, rows, cols, channels)`, in any case ("nhwc").
        name: the extractor's name; default `<model name>_features`.

    Returns:
        A functional `keras.Model` whose outputs are the list of features (one
        feature comes as one tensor: Keras unwraps a one-output list). It
        shares `model`'s layers and variables and computes no block after the
        last one asked for.

    Example:
        >>> model = keras_cait.CaiT_XXS24(weights=None, include_top=False)
        >>> extractor = feature_extractor(model, indices=[0, -1], output_format="NHWC")
        >>> [x.shape for x in extractor.predict(np.zeros((1, 224, 224, 3)))]
        [(1, 14, 14, 192), (1, 14, 14, 192)]
    """
    check_model_object(model, "feature_extractor")
    inputs, _, features = _tapped(model, indices, norm, output_format)
    return keras.Model(inputs, features, name=name or f"{model.name}_features")


def forward_intermediates(
    model, images, indices=None, norm=False, output_format="NLC", intermediates_only=False
):
    """`model`'s output and chosen self-attention blocks' outputs for `images`, as timm.

    Args:
        model, indices, norm, output_format: as in `feature_extractor`.
        images: a batch as the model takes it (0..255 RGB for models that
            normalise their input themselves).
        intermediates_only: return the features alone.

    Returns:
        `(model output, [features])`, or `[features]` with `intermediates_only`,
        as tensors of the backend. timm's final output is the normed token
        sequence, i.e. the output of `build_cait(..., include_top=False)`.
    """
    check_model_object(model, "forward_intermediates")
    output_format = _checked_output_format(output_format)
    intermediates_only = checked_bool("intermediates_only", intermediates_only,
                                      "True (the features alone) or False (the model's output and the features)")
    cached = _INTERMEDIATE_MODELS.setdefault(model, {})
    key = (repr(indices), norm, output_format, intermediates_only)
    if key not in cached:
        inputs, outputs, features = _tapped(model, indices, norm, output_format)
        outputs = features if intermediates_only else [outputs, features]
        cached[key] = keras.Model(inputs, outputs, name=f"{model.name}_intermediates")
    if not hasattr(images, "shape"):
        images = np.asarray(images)
    check_images(images, model.inputs[0].shape, model.name)  # the model's own check, not the replay's name
    result = cached[key](images, training=False)
    final, features = (None, result) if intermediates_only else result
    features = list(features) if isinstance(features, (list, tuple)) else [features]
    return features if intermediates_only else (final, features)
