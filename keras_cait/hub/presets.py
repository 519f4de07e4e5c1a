"""The released CaiT checkpoints as keras-hub presets, named as timm names them.

A preset name (`"cait_s24_224"`) gives the architecture (the variant table,
`keras_cait.variants.VARIANTS`) at the checkpoint's resolution; its weights are
those of `weights="imagenet"`: fetched, verified, converted and cached once by
`keras_cait.weights.imagenet_weights`, then copied layer by layer, by name, into
the keras-hub model, whose backbone is built by the same `build_cait`.
"""

import os

from keras_cait.variants import VARIANTS, parse_model_name
from keras_cait.weights.registry import CHECKPOINTS

PRESETS = tuple(CHECKPOINTS)


def variant(preset):
    """"cait_s24_224" -> "S24"."""
    return parse_model_name(preset)[0]


def is_released(preset):
    """Whether `preset` names a released checkpoint; a "cait_..." name that is neither one
    nor a folder is an error that lists them."""
    if not isinstance(preset, str) or os.path.exists(preset) or "://" in preset:
        return False
    if preset in CHECKPOINTS:
        return True
    if preset.startswith("cait_"):
        raise ValueError(
            f"preset={preset!r}: no such CaiT checkpoint; the released ones are "
            f"{', '.join(PRESETS)}. Or pass a preset folder (save_to_preset) or an hf:// handle."
        )
    return False


def backbone_config(preset):
    """The `CaiTBackbone` arguments of a released checkpoint."""
    side = CHECKPOINTS[preset]["resolution"]
    return dict(image_shape=(side, side, 3), **VARIANTS[variant(preset)])


def image_size(preset):
    side = CHECKPOINTS[preset]["resolution"]
    return (side, side)


def load_imagenet_weights(backbone, preset, head=None):
    """Loads the ImageNet weights of `preset` into `backbone` (and the 1000-class `head`)."""
    from keras_cait.variants import cait

    reference = cait(preset, weights="imagenet", classifier_activation=None, include_preprocessing=False)
    for layer in backbone.layers:
        if layer.weights:
            layer.set_weights(reference.get_layer(layer.name).get_weights())
    if head is not None:
        head.set_weights(reference.get_layer("predictions").get_weights())
