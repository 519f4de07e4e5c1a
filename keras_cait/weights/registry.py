"""The released CaiT checkpoints: where each one lives and how to verify it; the kinds of
weights file a `weights=` argument reads (`WEIGHT_FILES`).

All are ImageNet-1k, distilled (`fb_dist_in1k`), float32, Apache-2.0, from the
CaiT authors, re-hosted by timm on the Hugging Face hub as `model.safetensors`
whose keys are timm's state_dict names. Each is evaluated at its own resolution,
bicubic resize, crop_pct 1.0, ImageNet mean/std.

A sha256 is pinned only where a trustworthy public record of it exists; the
others are verified against the hash and size the hub sends with the download
(`X-Linked-Etag`, `X-Linked-Size` / `Content-Length`) and then by their exact
key set and shapes.
"""

import os

TAG = "fb_dist_in1k"
HUB_URL = "https://huggingface.co/timm"
HUB_URL_ENV = "KERAS_CAIT_HUB_URL"  # overrides HUB_URL, e.g. a mirror or a test server

# The files a `weights=` argument takes, everywhere (`keras_cait.models.checked_weights`): a timm or
# DeiT checkpoint (.safetensors; .pth and .pt, PyTorch's files, read with torch.load(weights_only=True))
# or keras_cait's own Keras weights (`keras-cait convert`, `model.save_weights`).
WEIGHT_FILES = (".safetensors", ".pth", ".pt", ".weights.h5")

#   timm arch           resolution   top-1   sha256 of model.safetensors (None: not pinned)
CHECKPOINTS = {
    "cait_xxs24_224": dict(resolution=224, top1=78.400,
                           sha256="396b92244e28808d4bd719d7e7a9d7ca13ac903686ed4d218504a40a4d70080c"),
    "cait_xxs24_384": dict(resolution=384, top1=80.954, sha256=None),
    "cait_xxs36_224": dict(resolution=224, top1=79.750, sha256=None),
    "cait_xxs36_384": dict(resolution=384, top1=82.204, sha256=None),
    "cait_xs24_384": dict(resolution=384, top1=84.064, sha256=None),
    "cait_s24_224": dict(resolution=224, top1=83.484, sha256=None),
    "cait_s24_384": dict(resolution=384, top1=85.048, sha256=None),
    "cait_s36_384": dict(resolution=384, top1=85.458, sha256=None),
    "cait_m36_384": dict(resolution=384, top1=86.060, sha256=None),
    "cait_m48_448": dict(resolution=448, top1=86.480, sha256=None),
}


def hub_url_override():
    """`KERAS_CAIT_HUB_URL` where it is set to something; None where it is unset, empty or blank (as
    `KERAS_CAIT_HUB_URL= keras-cait ...` unsets it in a shell)."""
    return os.environ.get(HUB_URL_ENV, "").strip() or None


def checkpoint_url(arch):
    """The download URL of a checkpoint's `model.safetensors`."""
    base = (hub_url_override() or HUB_URL).rstrip("/")
    return f"{base}/{arch}.{TAG}/resolve/main/model.safetensors"


def official_pth(arch):
    """The checkpoint's original file from the CaiT authors, e.g. cait_s24_384 -> .../deit/S24_384.pth.

    Its name is the arch's without the "cait_" prefix, in capitals, for all ten.
    """
    return f"https://dl.fbaipublicfiles.com/deit/{arch.removeprefix('cait_').upper()}.pth"
