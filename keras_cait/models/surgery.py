"""Model surgery on a CaiT: a new head, freezing the backbone, another resolution or dtype
policy, LoRA updates merged into the kernels. Each returns a model (or changes one) and
trains nothing; `keras_cait.training` and `keras_cait.export` both use them."""

import os
import tempfile

import keras

from keras_cait.errors import ArgumentError, Named, checked_bool
from keras_cait.layers import PatchEmbedding, PositionEmbedding
from keras_cait.layers.initializers import python_generator_kept
from keras_cait.layers.position_embedding import resize_position_embedding
from keras_cait.layers.trainable import set_trainable
from keras_cait.models.architecture import (
    HEAD_NAME, CaiTModel, checked_classes, checked_drop_path_rate, classifier_head, with_class_names,
)
from keras_cait.models.blocks import SelfAttentionBlock
from keras_cait.models.inputs import checked_image_size, with_sides
from keras_cait.models.precision import checked_dtype, has_dtype_policy, layer_dtype

FEATURE_LAYERS = ("token_pool", "avg_pool")


def pooled_features(model, argument="model"):
    """The layer whose output a CaiT's head reads: `token_pool` (the class token) or `avg_pool`
    (the patch mean). A model without either (no head and `pooling=None`, or not a CaiT) is an
    `ArgumentError` naming `argument`."""
    for name in FEATURE_LAYERS:
        if name in [layer.name for layer in model.layers]:
            return model.get_layer(name)
    raise ArgumentError(
        argument, model, f"{model.name!r} has no pooled features (a {FEATURE_LAYERS[0]!r} or {FEATURE_LAYERS[1]!r} layer)",
        ["build it with ", Named("include_top", True), ", or with ", Named("include_top", False), " and ",
         Named("pooling", "token"), " or ", Named("pooling", "avg")], shown=f"<model {model.name!r}>",
    )


def check_model_object(model, needed_by, inputs=False):
    """`model` of `needed_by`, which takes a built Keras model (an exporter, `attention_maps`): a
    name or a path is refused saying how to load it, anything else naming its type; with `inputs`
    (the exporters, which trace it on its input), a model without inputs yet too. An
    `ArgumentError` naming `model`."""
    if isinstance(model, keras.Model):
        if inputs and not _has_inputs(model):  # a Sequential without an Input, never called on data
            raise ArgumentError("model", model, f"{needed_by} takes a built model; this {type(model).__name__} has "
                                "no inputs yet", "give it a keras.Input(shape=(224, 224, 3)) first, or call it on "
                                "images once", usage=True, shown=f"<{model.name}>")
        return
    if isinstance(model, (str, os.PathLike)):
        raise ArgumentError("model", os.fspath(model), f"{needed_by} takes a Keras model, not a name or a path",
                            ["load it first: keras_cait.models.load_classifier(", repr(os.fspath(model)), ")"],
                            usage=True)
    raise ArgumentError("model", model, f"{needed_by} takes a Keras model, not a {type(model).__name__}",
                        "give a keras.Model, e.g. keras_cait.CaiT_XXS24() or keras.models.load_model('name.keras')",
                        usage=True, shown=f"<{type(model).__name__}>")


def _has_inputs(model):
    try:
        return bool(model.inputs)
    except (AttributeError, ValueError):  # Keras: "has no defined inputs yet"
        return False


def with_new_head(model, classes, classifier_activation="softmax", name=None, class_names=None):
    """A classifier (`CaiTModel`) for `classes` classes on the features of a CaiT `model`.

    `model` is a CaiT with or without its head (`include_top=False` with
    `pooling="token"` or `"avg"`); its layers are shared, not copied. The new
    head `predictions` (`keras_cait.models.architecture.classifier_head`) is initialised
    like the original one (N(0, 0.02²) weights, zero bias, as DeiT's fine-tuning) and has the
    dtype policy of the features it reads: float32 under mixed precision, whatever the global policy.
    `class_names` (one per class, in index order) are kept in the model and in
    the `.keras` files it is saved to.

    Example:
        >>> backbone = keras_cait.CaiT_XXS24(include_top=False, pooling="token")
        >>> model = with_new_head(backbone, classes=5)
    """
    check_model_object(model, "with_new_head")
    classes = checked_classes(classes)
    if name is not None and (not isinstance(name, str) or not name.strip() or "/" in name):
        raise ArgumentError("name", name, "must be a model's name: a str, not empty, without '/'",
                            ["e.g. ", Named("name", "flowers"), ", or leave it out for the model's own"], usage=True)
    features = pooled_features(model)
    head = classifier_head(classes, classifier_activation, features.dtype_policy)
    named = model.name if name is None else name
    return with_class_names(CaiTModel(model.inputs, head(features.output), name=named), class_names)


def set_backbone_trainable(model, trainable):
    """Freezes (`False`) or unfreezes (`True`) every layer but the head `predictions`.

    Recompile the model afterwards, as Keras requires, e.g. with a lower
    learning rate for fine-tuning the whole network after training the head.
    """
    check_model_object(model, "set_backbone_trainable")
    trainable = checked_bool("trainable", trainable, "True (unfreeze) or False (freeze)")
    check_has_head(model)
    if any(getattr(layer, "lora_enabled", False) for layer in model._flatten_layers(include_self=False)):
        raise ArgumentError("model", None, "has LoRA (enable_lora): its LoRA factors and head are what trains, and "
                            "freezing or unfreezing the backbone around them leaves neither LoRA nor a full "
                            "fine-tuning", "merge_lora(model) first to fine-tune the whole network", usage=True,
                            shown=f"<{model.name}>")
    for layer in model.layers:
        set_trainable(layer, trainable or layer.name == HEAD_NAME)


def check_has_head(model):
    """`model` of the calls that train its head (`set_backbone_trainable`, `enable_lora`) has one; else
    an `ArgumentError` naming `model`."""
    if HEAD_NAME not in [layer.name for layer in model.layers]:
        raise ArgumentError("model", model, f"has no head layer '{HEAD_NAME}' to keep training",
                            "give it one first: with_new_head(model, classes)", usage=True, shown=f"<{model.name}>")


def at_resolution(model, image_size):
    """The same CaiT at `image_size × image_size` inputs, with the weights of `model`.

    Every weight is copied; the position embedding is resized bicubically to the
    new patch grid (`resize_position_embedding`), as DeiT fine-tunes at 384
    from a 224 model. `image_size` must be a multiple of the patch size.
    """
    check_model_object(model, "at_resolution")
    patch_size = next(
        (layer.patch_size for layer in model.layers if isinstance(layer, PatchEmbedding)), None
    )
    if patch_size is None:  # was a bare StopIteration
        raise ArgumentError("model", model, f"{model.name!r} has no PatchEmbedding layer: it is not a CaiT at the "
                            "top level", "give a CaiT (keras_cait.CaiT_* or load_classifier), not a model that wraps "
                            "one", usage=True, shown=f"<{model.name}>")
    image_size = checked_image_size(image_size, patch_size)
    _check_no_lora(model, "at_resolution", image_size)
    grid = image_size // patch_size
    positions = {layer.name for layer in model.layers if isinstance(layer, PositionEmbedding)}

    input_shape = with_sides(model, image_size, image_size)  # channels first or last, as the model takes them

    def resize(layer_config):
        if layer_config["class_name"] == "InputLayer":
            layer_config["config"]["batch_shape"] = input_shape
        elif layer_config["config"]["name"] in positions:
            layer_config["config"]["grid_size"] = [grid, grid]

    def position_embedding(old, new):
        embeddings = keras.ops.convert_to_numpy(old.embeddings)
        new.embeddings.assign(resize_position_embedding(embeddings, (grid, grid), old.grid_size))

    return _rebuilt(model, resize, {PositionEmbedding: position_embedding})


def _check_no_lora(model, rebuilt_by, argument):
    """A model with enable_lora's weights, which a rebuild by `rebuilt_by` does not carry over, refused
    naming `model` and how to go on (`argument`: the call's other argument as written)."""
    if any(weight.path.endswith("/lora_kernel_a") for weight in model.weights):  # enable_lora's
        raise ArgumentError("model", model, f"has LoRA weights, which {rebuilt_by} does not carry over",
                            f"merge them first: {rebuilt_by}(merge_lora(model), {argument}), then enable_lora "
                            "on the result if training goes on", usage=True, shown=f"<{model.name}>")


def with_dtype_policy(model, policy):
    """The same CaiT computing under `policy` (e.g. "mixed_bfloat16"), with the weights of `model`.

    A `.keras` file keeps the dtype policy each layer was built with, so a model
    saved in float32 and loaded under a mixed global policy still computes in
    float32. This rebuilds it as `build_cait` would under `policy`: the blocks
    and the patch embedding in `policy`, the residual stream's parameters, the
    final norm and the head in float32 where `policy` is mixed. A model already
    under `policy` is returned as it is.
    """
    check_model_object(model, "with_dtype_policy")
    policy = keras.dtype_policies.get(None if policy is None else checked_dtype(policy, "policy")).name

    def repolicy(layer_config):
        if layer_config["class_name"] == "InputLayer" or "dtype" not in layer_config["config"]:
            return
        layer_config["config"]["dtype"] = layer_dtype(layer_config["config"]["name"], policy)

    if has_dtype_policy(model, policy):
        return model
    _check_no_lora(model, "with_dtype_policy", repr(policy))  # was Keras' set_weights count error
    quantized = sorted({layer.quantization_mode for layer in model._flatten_layers() if layer.quantization_mode})
    if quantized:  # its int8 kernels hold no float32 weights to compute in `policy` from (Keras' count error)
        raise ArgumentError("model", model, f"is quantized ({', '.join(quantized)}: model.quantize), and its "
                            f"quantized kernels cannot compute under {policy!r}",
                            f"change the float model's policy, then quantize the result: model = "
                            f"with_dtype_policy(float_model, {policy!r}); model.quantize({quantized[0]!r})",
                            usage=True, shown=f"<{model.name}>")
    return _rebuilt(model, repolicy)


def with_drop_path_rate(model, rate):
    """The same CaiT with stochastic depth `rate` in its self-attention blocks (as `build_cait`'s
    `drop_path_rate` puts it there), with the weights of `model`; `model` itself where it has it."""
    check_model_object(model, "with_drop_path_rate")
    rate = checked_drop_path_rate(rate, "rate")
    blocks = [layer for layer in model.layers if isinstance(layer, SelfAttentionBlock)]
    if all(block.drop_path_rate == rate for block in blocks):
        return model
    names = {block.name for block in blocks}

    def set_rate(layer_config):
        if layer_config["config"].get("name") in names:
            layer_config["config"]["drop_path_rate"] = float(rate)

    return _rebuilt(model, set_rate)


def merge_lora(model):
    """A copy of `model` with every LoRA update folded into its kernel: `W ← W + (alpha/rank)·A B`.

    The copy has the architecture and weight layout of a plain CaiT (no LoRA
    variables), so it saves, converts and exports like any other; its outputs
    equal those of `model`. A model without LoRA is copied unchanged.
    """
    check_model_object(model, "merge_lora")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "merged.weights.h5")
        # A LoRA Dense saves its merged kernel (W + (alpha/rank)·A B), not A and B.
        model.save_weights(path)
        merged = _copied(model.get_config(), model)
        merged.load_weights(path)
    return merged


def _rebuilt(model, edit, copy_weights=None):
    """`model` rebuilt from its config after `edit(layer_config)` of each layer, with its weights
    (`copy_weights[type](old, new)` for the layer types that need more than a copy)."""
    config = model.get_config()
    for layer_config in config["layers"]:
        # Rebuilt as the graph is called, not as recorded.
        layer_config.pop("build_config", None)
        edit(layer_config)
    rebuilt = _copied(config, model)
    for old, new in zip(model.layers, rebuilt.layers):
        copy = (copy_weights or {}).get(type(old))
        if copy:
            copy(old, new)
        else:
            _copy_weights(old, new)
        new.trainable = old.trainable
    return rebuilt


def _copy_weights(old, new):
    """`new`'s weights set to those of `old` of the same path: a layer that `model.quantize` made float8
    after it was built orders its variables otherwise than one built quantized from its config."""
    weights = {weight.path: weight for weight in old.weights}
    if sorted(weights) != sorted(weight.path for weight in new.weights):
        new.set_weights(old.get_weights())
        return
    for weight in new.weights:
        weight.assign(weights[weight.path])


def _copied(config, model):
    """A model of `model`'s class built from `config`, leaving Python's global generator as it was: the
    copy takes the original's weights, its seed generators' states included."""
    with python_generator_kept():
        return model.__class__.from_config(config)
