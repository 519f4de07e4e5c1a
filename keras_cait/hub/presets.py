"""The released CaiT checkpoints as keras-hub presets, named as timm names them.

A preset name (`"cait_s24_224"`) gives the architecture (the variant table,
`keras_cait.models.variants.VARIANTS`) at the checkpoint's resolution: `backbone_config`.
Its weights are timm's `model.safetensors`, fetched, verified and cached as
`weights="imagenet"` gets them, by `keras_cait.weights` (the Hugging Face cache where
huggingface_hub is installed, else keras_cait's downloader and cache), and put straight
into the one keras-hub model through timm's key map (`keras_cait.weights.timm_key_map`):
`load_weights`, as keras-hub's own timm converters do. `from_preset(preset, weights=PATH)` reads
a checkpoint file instead, with no network (`weights_argument`).
"""

import os

from keras_cait.models.architecture import build_cait
from keras_cait.models.variants import VARIANTS, parse_model_name
from keras_cait.weights import (
    CHECKPOINTS, checkpoint_grid, load_imagenet_weights, load_state_dict, load_weights_file, read_checkpoint,
)

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


# The files `weights=` reads: timm's or DeiT's checkpoint, or keras_cait's Keras weights.
WEIGHT_FILES = (".safetensors", ".pth", ".weights.h5")


def weights_argument(preset, load_weights, options):
    """What `from_preset(preset, load_weights, **options)` loads, `weights` taken out of `options`:
    "imagenet" (the preset's checkpoint, fetched), a file's path, or None (random weights).

    `weights=` takes what `keras_cait.CaiT_*(weights=...)` takes: "imagenet", None, or a
    .safetensors / .pth checkpoint (timm's or DeiT's names) or a .weights.h5 file of keras_cait,
    e.g. the file a download error asks for when there is no network. It applies to the released
    presets only; a preset folder or handle holds its own weights.
    """
    if "weights" not in options:
        return "imagenet" if load_weights else None
    weights = options.pop("weights")
    shown = f"weights={os.fspath(weights)!r}" if isinstance(weights, (str, os.PathLike)) else f"weights={weights!r}"
    if not is_released(preset):
        raise ValueError(f"{shown}: applies to the released CaiT presets ({', '.join(PRESETS)}); the preset "
                         f"{preset!r} holds its own weights, and load_weights=False leaves them out.")
    if weights is None or weights == "imagenet":
        return weights if load_weights else None
    if not load_weights:
        raise ValueError(f"{shown} with load_weights=False: give one; load_weights=False builds random weights "
                         "and reads no file.")
    if not isinstance(weights, (str, os.PathLike)) or not os.fspath(weights).endswith(WEIGHT_FILES):
        raise ValueError(f"{shown}: give 'imagenet', None, or the path of a {', '.join(WEIGHT_FILES[:-1])} or "
                         f"{WEIGHT_FILES[-1]} file, e.g. weights='/path/to/model.safetensors'.")
    if not os.path.isfile(weights):
        raise ValueError(f"{shown}: no such file; check the path.")
    return os.fspath(weights)


def load_weights(backbone, preset, weights="imagenet", head=None):
    """Puts `weights` ("imagenet" or a file, see `weights_argument`) into `backbone` (and the
    1000-class `head`, a Dense layer outside it, or None for a new head).

    "imagenet": `keras_cait.weights.load_imagenet_weights`, as for `weights="imagenet"`: the
    preset's checkpoint goes straight into the backbone's variables through timm's key map,
    strictly. A .safetensors or .pth file goes in the same way (`keras_cait.weights.load_state_dict`).
    A .weights.h5 file of keras_cait (`keras-cait convert`, `model.save_weights`) is loaded into
    the CaiT it was saved from (`keras_cait.weights.load_weights_file`) and copied layer by layer:
    the backbone's layers have the same names.
    """
    integer = [weight.path for weight in backbone.weights if "int" in weight.dtype]
    if integer:
        raise ValueError(
            f"{preset}: the backbone's {integer[0]} holds integers (quantized) and cannot "
            "take the float checkpoint; load the preset in float, then call backbone.quantize('int8')."
        )
    if weights == "imagenet":
        load_imagenet_weights(backbone, preset, head=head)
    elif weights.endswith(".weights.h5"):
        config = backbone_config(preset)
        source = build_cait(input_shape=config.pop("image_shape"), **config)
        load_weights_file(source, weights)  # the file's checks (shapes, NaN) and its grid
        for layer in backbone.layers:
            if layer.weights:
                layer.set_weights(source.get_layer(layer.name).get_weights())
        if head is not None:
            head.set_weights(source.get_layer("predictions").get_weights())
    else:
        load_state_dict(backbone, read_checkpoint(weights), source=f"checkpoint {weights}",
                        source_grid=checkpoint_grid(weights), head=head)
