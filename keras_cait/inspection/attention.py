"""Attention maps of a CaiT model, read with the model's own weights.

In CaiT only the class token attends in the last two blocks (class attention,
Sec. 2.2 of the paper). Head h of class-attention block l computes

    S_l,h = softmax(q_class k^T / sqrt(d))    over the keys [x_class, x_1 .. x_N]

so S_l,h is one weight per patch (plus one on the class token itself): where the
class token looks. Reshaped to the patch grid these are the maps of the paper's
Fig. 6 and 7. The self-attention blocks give (patches × patches) maps, after the
post-softmax talking-heads mix.

`attention_maps` builds, once per model, a second functional model whose layers
ARE the model's layers (same objects, same variables: no copy, nothing to keep
in sync after training) but whose attention blocks also return their scores.
The model itself is not modified, so its own predictions cost what they did.

    maps = attention_maps(model, images)
    maps.class_attention[0].shape       # (batch, heads, rows, cols), first CA block
    maps = attention_maps(model, images, self_attention_blocks=[0, -1])
    maps.self_attention[-1].shape       # (batch, heads, patches, patches)
"""

import dataclasses
import weakref

import keras
import numpy as np

from keras_cait.errors import ArgumentError, checked_count
from keras_cait.layers import PositionEmbedding
from keras_cait.models.blocks import ClassAttentionBlock, SelfAttentionBlock
from keras_cait.models.inputs import check_images
from keras_cait.models.surgery import check_model_object

# model -> {self-attention block indices: the attention model}. Weak keys: the
# cache does not keep a deleted model (and its weights) alive.
_ATTENTION_MODELS = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
    """The attention weights of a batch of images.

    Attributes:
        class_attention: one float32 array per class-attention block, in order,
            of shape `(batch, heads, rows, cols)`: the class token's softmax
            weight on each patch, laid out on the patch grid.
        class_token_weight: one float32 array per class-attention block, of
            shape `(batch, heads)`: the weight the class token puts on itself.
            With the patch weights it sums to 1 per head.
        self_attention: `{block index: array (batch, heads, patches, patches)}`
            for the self-attention blocks asked for, indices as given (so -1
            stays -1); row i is where patch i looks, patches in row-major order.
        grid_size: `(rows, cols)` of the patch grid.
    """

    class_attention: list
    class_token_weight: list
    self_attention: dict
    grid_size: tuple


class _WithScores(keras.layers.Layer):
    """Calls an attention block with `return_attention_scores=True`.

    A fresh wrapper rather than calling the block itself this way: Keras checks a
    functional graph against the output structure of a layer's first call, which
    for the model's own blocks is the plain (scores-less) one.
    """

    def __init__(self, block, **kwargs):
        super().__init__(name=f"{block.name}_with_scores", dtype=block.dtype_policy, **kwargs)
        self.block = block

    def call(self, inputs, training=None):
        return self.block(inputs, training=training, return_attention_scores=True)

    def compute_output_spec(self, inputs, training=None):
        return self.block.compute_output_spec(inputs, return_attention_scores=True)


def _find_backbone(model):
    """`model`, or the nested model that holds the class-attention blocks."""
    if any(isinstance(layer, ClassAttentionBlock) for layer in model.layers):
        return model
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found = _find_backbone(layer)
            if found is not None:
                return found
    return None


def _self_attention_indices(requested, depth):
    if requested is None:
        return ()
    if isinstance(requested, str) and requested == "all":
        return tuple(range(depth))
    if isinstance(requested, np.ndarray):
        requested = requested.tolist()
    indices = list(requested) if isinstance(requested, (list, tuple)) else [requested]
    for index in indices:
        # A bool is no block index: True was taken as block 1.
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)) \
                or not -depth <= index < depth:
            raise ArgumentError(
                "self_attention_blocks", requested,
                f"{index!r} is not a block index; the model has {depth} self-attention blocks",
                f"use integers from {-depth} to {depth - 1}, a list of them, or 'all'", usage=True)
    return tuple(int(index) for index in indices)


def _attention_model(model, indices):
    """The functional model from `model`'s input to the scores it is asked for. Where the CaiT is
    nested (a model around it), `model`'s own layers run up to it: a `Rescaling` or `Resizing` in
    front changes what the CaiT sees."""
    if _find_backbone(model) is not model:
        inner = next(layer for layer in model.layers
                     if isinstance(layer, keras.Model) and _find_backbone(layer) is not None)
        tapped = _attention_model(inner, indices)
        replace = {inner: tapped}
    else:
        self_blocks = [layer for layer in model.layers if isinstance(layer, SelfAttentionBlock)]
        names = {self_blocks[i]: f"self_attention_{i}" for i in indices}
        names.update((layer, layer.name) for layer in model.layers if isinstance(layer, ClassAttentionBlock))
        replace = {layer: _WithScores(layer) for layer in names}
    scores = {}

    def call(layer, *args, **kwargs):
        if layer not in replace:
            return layer(*args, **kwargs)
        if isinstance(replace[layer], keras.Model):  # the nested CaiT's own attention model
            scores.update(replace[layer](*args))
            return layer(*args, **kwargs)
        outputs, scores[names[layer]] = replace[layer](*args, **kwargs)
        return outputs

    # clone_model would also compile the copy like the original (a new optimizer);
    # an uncompiled view of the same graph avoids that.
    view = keras.Model(model.inputs, model.outputs)
    replay = keras.models.clone_model(view, clone_function=lambda layer: layer, call_function=call)
    return keras.Model(replay.inputs, scores, name=f"{model.name}_attention")


def attention_maps(model, images, self_attention_blocks=None, batch_size=32):
    """Returns the class-attention maps (and chosen self-attention maps) of `images`.

    Args:
        model: a CaiT model from `build_cait` or a `CaiT_*` constructor, with or
            without its top or preprocessing, or a model that contains one (e.g.
            a backbone with a new head, or with `Rescaling` in front: the images go
            through the model's own layers up to it).
        images: array `(batch, height, width, channels)` as the model takes it
            (0..255 RGB for models that normalise their input themselves).
        self_attention_blocks: None, an index or list of indices into the
            self-attention blocks (negative counts from the last), or "all".
        batch_size: images per forward pass.

    Returns:
        An `AttentionMaps`.

    Example:
        >>> model = keras_cait.CaiT_XXS24(weights=None)
        >>> maps = attention_maps(model, np.zeros((1, 224, 224, 3)))
        >>> maps.class_attention[0].shape
        (1, 4, 14, 14)
    """
    check_model_object(model, "attention_maps")
    checked_count("batch_size", batch_size, 32, note=", the images per forward pass")
    backbone = _find_backbone(model)
    if backbone is None:
        raise ArgumentError(
            "model", model, f"{model.name} has no ClassAttentionBlock, in itself or in a model inside it, so it has "
            "no class attention to show", "pass a CaiT built by build_cait or CaiT_*, or a model that contains one",
            usage=True, shown=f"<{type(model).__name__} {model.name!r}>")
    images = np.asarray(images)
    check_images(images, model.input_shape, model.name)  # the model's own check: the fix for each shape
    images = images.astype("float32", copy=False)  # uint8 or float64 from a list: one trace, not one per dtype
    self_blocks = sum(isinstance(layer, SelfAttentionBlock) for layer in backbone.layers)
    indices = _self_attention_indices(self_attention_blocks, self_blocks)

    cached = _ATTENTION_MODELS.setdefault(model, {})
    key = tuple(sorted({i % self_blocks for i in indices}))
    if key not in cached:
        cached[key] = _attention_model(model, key)
    scores = cached[key].predict(images, batch_size=batch_size, verbose=0)
    scores = {name: np.asarray(value, dtype=np.float32) for name, value in scores.items()}

    grid_size = next(
        layer.grid_size for layer in backbone.layers if isinstance(layer, PositionEmbedding)
    )
    class_blocks = [layer.name for layer in backbone.layers if isinstance(layer, ClassAttentionBlock)]
    # Class attention scores are (batch, heads, 1 query, 1 + patches), class token first.
    class_scores = [scores[name][:, :, 0] for name in class_blocks]
    return AttentionMaps(
        class_attention=[s[:, :, 1:].reshape(s.shape[:2] + tuple(grid_size)) for s in class_scores],
        class_token_weight=[s[:, :, 0] for s in class_scores],
        self_attention={i: scores[f"self_attention_{i % self_blocks}"] for i in indices},
        grid_size=tuple(grid_size),
    )
