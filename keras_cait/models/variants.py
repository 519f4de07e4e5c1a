"""The CaiT variants of the paper (Table 3) and their constructors.

Names are XX<size><depth>: depth self-attention blocks, then 2 class-attention
blocks; patch size 16, MLP ratio 4. LayerScale starts at 1e-5 and at 1e-6 for the
deepest models, as in the reference (timm `cait.py`, facebookresearch/deit).

A row of `VARIANTS` is a variant: its constructor `CaiT_<name>` (made here, exported by
`keras_cait`), its line in the docs' variant table (`markdown_table`) and its tests follow
from the row; CONTRIBUTING.md ("Adding a variant") has the steps.
"""

import logging
import os
import re

from keras_cait.errors import ArgumentError, Named
from keras_cait.models.architecture import build_cait, checked_classes
from keras_cait.models.inputs import channels_last_shape, checked_input_shape, image_shape
from keras_cait.weights import CHECKPOINTS, WEIGHT_FILES, load_file, load_imagenet_weights
from keras_cait.weights.download import IMAGENET_CLASSES  # the classes of every released head

#                  width          depth      heads         LayerScale init
VARIANTS = {
    "XXS24": dict(embed_dim=192, depth=24, num_heads=4, init_values=1e-5),
    "XXS36": dict(embed_dim=192, depth=36, num_heads=4, init_values=1e-5),
    "XS24": dict(embed_dim=288, depth=24, num_heads=6, init_values=1e-5),
    "XS36": dict(embed_dim=288, depth=36, num_heads=6, init_values=1e-5),
    "S24": dict(embed_dim=384, depth=24, num_heads=8, init_values=1e-5),
    "S36": dict(embed_dim=384, depth=36, num_heads=8, init_values=1e-6),
    "S48": dict(embed_dim=384, depth=48, num_heads=8, init_values=1e-6),
    "M24": dict(embed_dim=768, depth=24, num_heads=16, init_values=1e-5),
    "M36": dict(embed_dim=768, depth=36, num_heads=16, init_values=1e-6),
    "M48": dict(embed_dim=768, depth=48, num_heads=16, init_values=1e-6),
}


PATCH_SIZE = 16  # every variant's


def parse_model_name(name, argument="model"):
    """One naming everywhere: 'cait_xxs24_224', 'cait_xxs24' and 'XXS24' (any case) name XXS24.

    Returns:
        `(variant, resolution)`, e.g. `("XXS24", 224)`, or `("XXS24", None)` when the
        name gives no resolution.

    Raises:
        `ArgumentError` (a ValueError) naming `argument` and the valid names.
    """
    parts = str(name).strip().lower().removeprefix("cait_").split("_")
    variant = parts[0].upper()
    if variant in VARIANTS and len(parts) == 1:
        return variant, None
    if variant in VARIANTS and len(parts) == 2 and parts[1].isdigit() and int(parts[1]) > 0:
        resolution = int(parts[1])
        if resolution % PATCH_SIZE:  # else blamed on the input_shape it becomes, which the caller never gave
            nearest = max(1, int(resolution / PATCH_SIZE + 0.5)) * PATCH_SIZE
            raise ArgumentError(argument, name, f"its resolution {resolution} is not a multiple of the patch size "
                                f"{PATCH_SIZE}", ["e.g. ", Named(argument, f"cait_{variant.lower()}_{nearest}")],
                                usage=True)
        return variant, resolution
    raise ArgumentError(
        argument, name, "unknown CaiT model",
        f"use a variant ({', '.join(VARIANTS)}), cait_<variant> or cait_<variant>_<resolution>, in any "
        "case, e.g. XXS24, cait_xxs24 or cait_xxs24_224", usage=True,
    )


def released_checkpoints(variant):
    """The variant's ImageNet checkpoints (timm arch names), from the one table of them,
    `keras_cait.weights.registry.CHECKPOINTS`: e.g. ("cait_s24_224", "cait_s24_384")."""
    prefix = f"cait_{variant.lower()}_"
    return tuple(arch for arch in CHECKPOINTS if arch.startswith(prefix))


def weights_allowed():
    """What `weights=` takes, as an error's `allowed` (its arguments `Named`, for each caller's spelling)."""
    return ["give ", Named("weights", "imagenet"), ", ", Named("weights", None), " or the path of a ",
            f"{', '.join(WEIGHT_FILES[:-1])} or {WEIGHT_FILES[-1]} file"]


def checked_weights(weights):
    """`weights` as one value, the same for every caller: "imagenet"; None (also "none" in any
    case, as the command line writes it); or the path (str) of an existing file whose name ends in
    one of `keras_cait.weights.WEIGHT_FILES`. Anything else is an `ArgumentError` naming `weights`."""
    if isinstance(weights, os.PathLike):
        weights = os.fsdecode(weights)
    if weights is None or (isinstance(weights, str) and weights.strip().lower() == "none"):
        return None
    if weights == "imagenet":
        return weights
    if isinstance(weights, (bytes, bytearray)):
        raise ArgumentError("weights", weights, f"{len(weights)} bytes of {type(weights).__name__}, not a name or path",
                            [*weights_allowed(), "; for a checkpoint in memory, write it to a file and pass its path"],
                            usage=True, shown=f"{repr(weights)[:40]}...")
    if not isinstance(weights, str):
        raise ArgumentError("weights", weights, f"a {type(weights).__name__}, not a name or path", weights_allowed(),
                            usage=True)
    if not weights.endswith(WEIGHT_FILES):
        if weights.endswith(".keras") and os.path.isfile(weights):  # the mirror of load_classifier's model=<checkpoint>
            raise ArgumentError("weights", weights, "is a whole model (model.save), not weights", [
                "load it as a model: keras_cait.models.load_classifier(", repr(weights), ") or the command's --model; "
                "or save its weights with model.save_weights('name.weights.h5') and give that"])
        if os.path.exists(weights):  # a path, said as one
            raise ArgumentError("weights", weights, "is a folder" if os.path.isdir(weights) else
                                "is a file of a kind keras_cait reads no weights from", weights_allowed())
        raise ArgumentError("weights", weights, "unknown weights name", weights_allowed(), usage=True)
    if not os.path.isfile(weights):
        raise ArgumentError("weights", weights, "is a folder" if os.path.isdir(weights) else "no such file",
                            weights_allowed())
    return weights

logger = logging.getLogger(__name__)


def default_image_size(name):
    """The input side of a CaiT built by `name` without an input shape: the resolution the name
    gives (cait_s24_384 -> 384), else that of the variant's first released checkpoint
    (cait_xs24 -> 384, its only one), else 224.

    It is the side of the checkpoint `weights="imagenet"` loads for the name, unresized; the
    constructors, `cait`, `keras-cait predict`, `evaluate` and `finetune` all take it.
    """
    variant, resolution = parse_model_name(name)
    checkpoints = released_checkpoints(variant)
    return resolution or (CHECKPOINTS[checkpoints[0]]["resolution"] if checkpoints else 224)


def select_checkpoint(variant, height, width):
    """The variant's checkpoint at (height, width), or else the nearest one (to be resized)."""
    checkpoints = released_checkpoints(variant)
    if not checkpoints:
        released = ", ".join(name for name in VARIANTS if released_checkpoints(name))
        raise ArgumentError(
            "weights", "imagenet", f"CaiT_{variant} has no released ImageNet checkpoint; variants with one: {released}",
            ["use ", Named("weights", None), " to train it, or the path of your own weights"], usage=True,
        )

    def distance(arch):
        resolution = CHECKPOINTS[arch]["resolution"]
        return abs(height - resolution) + abs(width - resolution)

    arch = min(checkpoints, key=distance)
    if distance(arch):
        logger.info(
            "CaiT_%s has no checkpoint at %dx%d; using %s and resizing its position "
            "embedding bicubically.", variant, height, width, arch,
        )
    return arch


def cait(
    variant,
    include_top=True,
    weights="imagenet",
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    include_preprocessing=True,
    drop_path_rate=0.0,
    name=None,
    dtype=None,
):
    """Builds a CaiT by name; see the constructors (e.g. `CaiT_S24`) for the arguments.

    `variant` is any name `parse_model_name` takes: "S24", "cait_s24" or
    "cait_s24_384" (whose resolution is the default input size). `keras_cait.models.load_classifier`
    takes a name too, and a `.keras` file or a model, with `image_size` for `input_shape`.
    """
    given = variant
    variant, _ = parse_model_name(given, argument="variant")
    side = default_image_size(given)
    config = VARIANTS[variant]
    if input_shape is None:
        if input_tensor is not None:
            input_shape = tuple(input_tensor.shape[1:])
        else:
            input_shape = image_shape(side, side)
    input_shape = checked_input_shape(input_shape)
    # build_cait names a shape of another rank; these serve the checks before it.
    height, width, channels = channels_last_shape(input_shape) if len(input_shape) == 3 else (None,) * 3

    weights = checked_weights(weights)
    pretrained = weights is not None
    if pretrained and len(input_shape) == 3 and channels != 3:
        raise ArgumentError(
            "input_shape", input_shape, f"pretrained weights need 3 channels (RGB), e.g. {image_shape(height, width)}",
            [f"for {channels} channels use ", Named("weights", None), ", ", Named("include_preprocessing", False)],
            usage=True,
        )
    if include_top:
        classes = checked_classes(classes)
    if weights == "imagenet" and include_top and classes != IMAGENET_CLASSES:
        raise ArgumentError(
            "classes", classes, f"the ImageNet head has {IMAGENET_CLASSES} classes",
            [f"for {classes} classes use ", Named("include_top", False), " and add your own head "
             "(keras_cait.models.with_new_head), or ", Named("weights", None)], usage=True,
        )

    arch = None
    if weights == "imagenet":
        arch = select_checkpoint(variant, height, width)
    model = build_cait(
        **config,
        include_top=include_top,
        input_tensor=input_tensor,
        input_shape=input_shape,
        pooling=pooling,
        classes=classes,
        classifier_activation=classifier_activation,
        include_preprocessing=include_preprocessing,
        drop_path_rate=drop_path_rate,
        name=name or f"cait_{variant.lower()}",
        dtype=dtype,
    )
    if arch is not None:
        load_imagenet_weights(model, arch)
    elif pretrained:
        load_file(model, weights, "weights")
    return model


BASE_DOCSTRING = """Instantiates CaiT-{variant} ("Going deeper with Image Transformers").

    {depth} self-attention blocks with talking heads and LayerScale, then 2
    class-attention blocks; width {embed_dim}, {num_heads} heads, patch 16.
    Released ImageNet checkpoints: {released}.

    Reference: Touvron et al., ICCV 2021, https://arxiv.org/abs/2103.17239

    Inputs are RGB images, channels last, values 0..255 (uint8 or float): the
    model normalises them itself unless `include_preprocessing=False`.

    Args:
        include_top: whether to include the 1000-way (or `classes`-way) head.
        weights: "imagenet" (downloaded once, verified, cached under
            ~/.keras/models/keras_cait), None (random), or a path to a timm/DeiT
            `.safetensors` / `.pth` / `.pt` checkpoint or a Keras `.weights.h5` file.
            "imagenet" takes the checkpoint at `input_shape`, or the nearest one
            with its position embedding resized bicubically.
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, channels)`, sides multiples of 16;
            defaults to ({resolution}, {resolution}, 3).
        pooling: None, "token" (the class token) or "avg" (mean of the patch
            tokens). Without the top and with None the output is the normalised
            token sequence `(batch, 1 + patches, {embed_dim})`, class token first.
        classes: number of classes of the head.
        classifier_activation: activation of the head; None returns logits.
        include_preprocessing: normalise 0..255 inputs with the ImageNet mean
            and std inside the model.
        drop_path_rate: stochastic-depth rate, the same for every block.
        name: model name.
        dtype: the layers' dtype policy, e.g. "mixed_bfloat16" (the residual stream,
            norms and head stay float32 under a mixed policy); None takes the global one.

    Returns:
        A functional `keras.Model`.
    """


def _constructor(variant):
    config = VARIANTS[variant]
    checkpoints = released_checkpoints(variant)
    # Variants without a released checkpoint build with random weights by default.
    default_weights = "imagenet" if checkpoints else None

    def constructor(
        include_top=True,
        weights=default_weights,
        input_tensor=None,
        input_shape=None,
        pooling=None,
        classes=1000,
        classifier_activation="softmax",
        include_preprocessing=True,
        drop_path_rate=0.0,
        name=None,
        dtype=None,
    ):
        return cait(
            variant, include_top=include_top, weights=weights, input_tensor=input_tensor,
            input_shape=input_shape, pooling=pooling, classes=classes,
            classifier_activation=classifier_activation,
            include_preprocessing=include_preprocessing, drop_path_rate=drop_path_rate, name=name,
            dtype=dtype,
        )

    constructor.__name__ = constructor.__qualname__ = f"CaiT_{variant}"
    constructor.__doc__ = BASE_DOCSTRING.format(
        variant=variant,
        released=", ".join(checkpoints) or "none (weights default to None)",
        resolution=default_image_size(variant),
        **{k: config[k] for k in ("depth", "embed_dim", "num_heads")},
    )
    return constructor


# One constructor per row, CaiT_XXS24 ... CaiT_M48: a new row of VARIANTS is a new constructor,
# exported by keras_cait as well (its __init__ takes CONSTRUCTORS whole).
CONSTRUCTORS = {f"CaiT_{variant}": _constructor(variant) for variant in VARIANTS}
globals().update(CONSTRUCTORS)


def _layer_scale_init(value):
    """1e-05 -> "1e-5", 0.1 -> "0.1": as the paper writes it."""
    return re.sub(r"e([-+])0*(\d)", r"e\1\2", f"{value:g}")


def markdown_table():
    """The variant table of README.md and docs/weights.md (between their `variants` markers):
    one line per row of `VARIANTS`, its released checkpoints from `CHECKPOINTS`.
    scripts/variant_tables.py writes it there; tests/models/test_variants.py fails when a copy differs."""
    lines = [
        "| constructor | depth (SA + CA) | width | heads | LayerScale init | released ImageNet checkpoints |",
        "|---|---|---|---|---|---|",
    ]
    for variant, config in VARIANTS.items():
        released = ", ".join(str(CHECKPOINTS[arch]["resolution"]) for arch in released_checkpoints(variant))
        lines.append(
            f"| `CaiT_{variant}` | {config['depth']} + 2 | {config['embed_dim']} | {config['num_heads']} | "
            f"{_layer_scale_init(config['init_values'])} | {released or '—'} |"
        )
    return "\n".join(lines)
