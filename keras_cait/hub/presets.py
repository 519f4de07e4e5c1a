"""The released CaiT checkpoints as keras-hub presets, named as timm names them.

A preset name (`"cait_s24_224"`) gives the architecture (the variant table,
`keras_cait.variants.VARIANTS`) at the checkpoint's resolution: `backbone_config`.
Its weights are timm's `model.safetensors`, fetched, verified and cached as
`weights="imagenet"` gets them, by `keras_cait.weights` (the Hugging Face cache where
huggingface_hub is installed, else keras_cait's downloader and cache), and put straight
into the one keras-hub model through timm's key map (`keras_cait.weights.timm_key_map`):
`load_imagenet_weights`, as keras-hub's own timm converters do.
"""

import os

from keras_cait import weights
from keras_cait.variants import VARIANTS, parse_model_name
from keras_cait.weights import CHECKPOINTS

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
    """Puts the ImageNet checkpoint of `preset` into `backbone` (and the 1000-class `head`).

    `keras_cait.weights.load_imagenet_weights`, as for `weights="imagenet"`: the checkpoint's
    tensors go straight into the backbone's variables through timm's key map, strictly; its
    `head.*` tensors go into `head`, a Dense layer, or are left out where `head` is None (a new
    head). No other model is built.
    """
    integer = [weight.path for weight in backbone.weights if "int" in weight.dtype]
    if integer:
        raise ValueError(
            f"{preset}: the backbone's {integer[0]} holds integers (quantized) and cannot "
            "take the float checkpoint; load the preset in float, then call backbone.quantize('int8')."
        )
    weights.load_imagenet_weights(backbone, preset, head=head)
