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

import json
import os

import keras

from keras_cait.errors import ArgumentError, Named, checked_bool
from keras_cait.io.atomic import written_atomically
from keras_cait.models import VARIANTS, checked_weights, parse_model_name
from keras_cait.models.variants import IMAGENET_CLASSES, cait
from keras_cait.weights import (
    CHECKPOINTS, checkpoint_grid, head_classes, load_imagenet_weights, load_state_dict, read_checkpoint,
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
    spelled = preset.strip().lower().replace("-", "_")  # 'CAIT_S24_224', 'cait-s24-224'
    if spelled in CHECKPOINTS:
        raise ArgumentError("preset", preset, "no such preset: presets are named in lower case with underscores",
                            f"did you mean {spelled!r}?", usage=True)
    if spelled.startswith("cait"):
        raise ArgumentError("preset", preset, "no such CaiT checkpoint",
                            f"the released ones are {', '.join(PRESETS)}; or pass a preset folder (save_to_preset) "
                            "or an hf:// handle", usage=True)
    return False


def backbone_config(preset):
    """The `CaiTBackbone` arguments of a released checkpoint."""
    side = CHECKPOINTS[preset]["resolution"]
    return dict(image_shape=(side, side, 3), **VARIANTS[variant(preset)])


def image_size(preset):
    side = CHECKPOINTS[preset]["resolution"]
    return (side, side)


def weights_argument(preset, load_weights, options):
    """What `from_preset(preset, load_weights, **options)` loads, `weights` taken out of `options`:
    "imagenet" (the preset's checkpoint, fetched), a file's path, or None (random weights).

    `weights=` takes what `keras_cait.CaiT_*(weights=...)` and `keras_cait.models.load_classifier`
    take (`keras_cait.models.checked_weights`): "imagenet", None (or "none"), or a .safetensors /
    .pth / .pt checkpoint (timm's or DeiT's names) or a .weights.h5 file of keras_cait, e.g. the file
    a download error asks for when there is no network. It applies to the released presets only; a
    preset folder or handle holds its own weights.
    """
    load_weights = checked_bool("load_weights", load_weights, "True (the preset's weights) or False (random)")
    if "weights" not in options:
        return "imagenet" if load_weights else None
    given = options.pop("weights")
    if not is_released(preset):
        raise ArgumentError("weights", given, f"applies to the released CaiT presets ({', '.join(PRESETS)}); the "
                            f"preset {preset!r} holds its own weights", ["leave it out; ", Named("load_weights", False),
                            " leaves them out"], usage=True)
    if load_weights:
        return checked_weights(given)
    try:
        reads_a_file = checked_weights(given) not in (None, "imagenet")
    except ArgumentError:  # a file, but not one that can be read: refused as a file
        reads_a_file = True
    if reads_a_file:
        raise ArgumentError("weights", given, "a file, with load_weights=False, which builds random weights and "
                            "reads no file", ["give one of ", Named("weights"), " and ", Named("load_weights")],
                            usage=True)
    return None


def load_weights(backbone, preset, weights="imagenet", head=None):
    """Puts `weights` ("imagenet" or a file, see `weights_argument`) into `backbone` (and the
    1000-class `head`, a Dense layer outside it, or None for a new head).

    "imagenet": `keras_cait.weights.load_imagenet_weights`, as for `weights="imagenet"`: the
    preset's checkpoint goes straight into the backbone's variables through timm's key map,
    strictly. A .safetensors or .pth file goes in the same way (`keras_cait.weights.load_state_dict`).
    A .weights.h5 file of keras_cait (`keras-cait convert`, `model.save_weights`) is loaded into
    the CaiT it was saved from (`keras_cait.models.variants.cait`, at the backbone's size, with the
    file's head or none) and copied layer by layer:
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
        classes = head_classes(weights)
        if head is not None and classes != head.units:
            raise ArgumentError("weights", weights, "holds no head" if classes is None else
                                f"has a head of {classes} classes, the preset one of {head.units}",
                                ["give ", Named("num_classes"), " for a new head on its backbone"] if classes is None
                                else ["give ", Named("num_classes", classes), " (its head is loaded with it)"],
                                usage=True)
        # Built at the backbone's size as the file's model (with its head, if any): the file's checks
        # (shapes, NaN) and its position embedding resized to the backbone's grid.
        source = cait(preset, weights=weights, input_shape=tuple(backbone.inputs[0].shape[1:]),
                      include_top=classes is not None, classes=classes or IMAGENET_CLASSES)
        for layer in backbone.layers:
            if layer.weights:
                layer.set_weights(source.get_layer(layer.name).get_weights())
        if head is not None:
            head.set_weights(source.get_layer("predictions").get_weights())
    else:
        load_state_dict(backbone, read_checkpoint(weights), source=f"checkpoint {weights}",
                        source_grid=checkpoint_grid(weights), head=head)


def save_float_dtype(preset_dir):
    """Writes the variables' dtype ("float32") where `config.json` holds a mixed policy
    ("mixed_bfloat16"), after `save_to_preset`. keras-hub's loader reads that dtype to choose the
    policy a preset loads under and takes only a plain float dtype (which it swaps for the global
    policy) or a quantization map: a mixed policy fails there (`Invalid dtype: mixed_bfloat16`), so a
    model fine-tuned under mixed precision could not be loaded back. It loads under the global policy,
    as keras-hub's own presets do, or the `dtype=` given to `from_preset`."""
    path = os.path.join(os.fspath(preset_dir), "config.json")
    with open(path) as file:
        config = json.load(file)
    dtype = config.get("config", {}).get("dtype")
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else None
    if not (isinstance(name, str) and name.startswith("mixed_")):
        return
    dtype["config"]["name"] = keras.dtype_policies.get(name).variable_dtype
    with written_atomically(path) as partial, open(partial, "w") as file:
        json.dump(config, file, indent=4)
