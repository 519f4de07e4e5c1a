"""The released CaiT checkpoints as keras-hub presets, named as timm names them.

A preset name (`"cait_s24_224"`) gives the architecture (the variant table,
`keras_cait.variants.VARIANTS`) at the checkpoint's resolution: `backbone_config`.
Its weights are timm's `model.safetensors`, fetched and verified as
`weights="imagenet"` fetches them (the Hugging Face cache where huggingface_hub
is installed, else keras_cait's downloader and cache), and put straight into the
one keras-hub model through timm's key map (`keras_cait.weights.timm_key_map`):
`load_imagenet_weights`, as keras-hub's own timm converters do.
"""

import os

import numpy as np

from keras_cait import atomic
from keras_cait.variants import VARIANTS, parse_model_name
from keras_cait.weights import download, hf_cache
from keras_cait.weights.convert import _dense, load_state_dict, read_checkpoint
from keras_cait.weights.registry import CHECKPOINTS, TAG

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


def checkpoint_file(preset, max_bytes):
    """(path, description) of the verified `model.safetensors` of `preset`.

    From the Hugging Face cache (downloaded into it once) where huggingface_hub is
    installed and KERAS_CAIT_HUB_URL is not set; else downloaded once, verified,
    into keras_cait's cache (`keras_cait.weights.cache_dir()`).
    """
    huggingface_hub = hf_cache.huggingface_hub_or_none()
    if huggingface_hub is not None:
        return hf_cache.checkpoint(huggingface_hub, preset)
    target = os.path.join(download.cache_dir(), f"{preset}.{TAG}.safetensors")
    if not os.path.isfile(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with download.one_download_at_a_time(target):
            if not os.path.isfile(target):  # else another process fetched it while this one waited
                with atomic.written_atomically(target) as partial:
                    download.download(preset, partial, max_bytes=max_bytes)
    return target, f"cached file {target}"


def _size_bound(backbone, classes=1000):
    """The most bytes the checkpoint can take: the float32 backbone and 1000-class head, + 1 %."""
    parameters = sum(int(np.prod(weight.shape)) for weight in backbone.weights)
    parameters += (backbone.embed_dim + 1) * classes
    return 4 * parameters * 101 // 100


def load_imagenet_weights(backbone, preset, head=None):
    """Puts the ImageNet checkpoint of `preset` into `backbone` (and the 1000-class `head`).

    The checkpoint's tensors go straight into the backbone's variables through
    timm's key map, strictly (every key, every shape; `load_state_dict`); its
    `head.*` tensors go into `head`, a Dense layer, or are left out where
    `head` is None (a new head). No other model is built.
    """
    integer = [weight.path for weight in backbone.weights if "int" in weight.dtype]
    if integer:
        raise ValueError(
            f"{preset}: the backbone's {integer[0]} holds integers (quantized) and cannot "
            "take the float checkpoint; load the preset in float, then call backbone.quantize('int8')."
        )
    path, source = checkpoint_file(preset, _size_bound(backbone))
    state_dict = read_checkpoint(path)
    load_state_dict(backbone, state_dict, source=source)
    if head is not None:
        for key, variable, transform in _dense("head", head):
            value = np.asarray(state_dict.get(key, np.zeros(0)), dtype="float32")
            value = transform(value) if transform else value
            if value.shape != tuple(variable.shape):
                raise ValueError(
                    f"The {source} has no {key} of shape {tuple(variable.shape)}: no 1000-class head "
                    "to load; pass num_classes for a new head."
                )
            variable.assign(value)
