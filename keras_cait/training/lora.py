"""LoRA fine-tuning (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A frozen Dense kernel `W` (d_in × d_out) learns a low-rank update instead of
being trained itself:

    W' = W + (alpha / rank) · A B        A: d_in × rank,  B: rank × d_out

`A` starts random (He uniform) and `B` at zero, so training starts from the
pretrained model exactly. Keras builds this into `Dense.enable_lora`; here it is
applied to the attention projections of a CaiT, everything else is frozen but
the classification head `predictions`, which a new task trains in full.

The Dense layers of a CaiT, by name (any of them can be a target):

    qkv                        self-attention blocks: query, key and value in one kernel
    query, key, value          class-attention blocks
    output_projection          both kinds of attention
    mlp_dense_1, mlp_dense_2   the MLP of every block
    pre_softmax_head_mix,      talking heads (heads × heads, too small to need LoRA)
    post_softmax_head_mix

Example:
    model = with_new_head(CaiT_XXS24(include_top=False, pooling="token"), classes=10)
    enable_lora(model, rank=8)           # then compile and fit as usual
    served = merge_lora(model)           # a plain CaiT: export it like any other
"""

import numbers

import keras

from keras_cait.errors import ArgumentError, Named, checked_count
from keras_cait.models.surgery import (  # noqa: F401  merge_lora: also keras_cait.training.lora's
    HEAD_NAME, check_has_head, check_model_object, merge_lora,
)

ATTENTION_PROJECTIONS = ("qkv", "query", "key", "value", "output_projection")


def _sublayers(model):
    # Keras has no public walk over nested sublayers (Model.layers lists the top
    # level only); Model.quantize walks them with the same method.
    return model._flatten_layers(include_self=False)


def enable_lora(model, rank, targets=ATTENTION_PROJECTIONS, alpha=None):
    """Adds rank-`rank` LoRA updates to the Dense layers named in `targets`; freezes the rest.

    Afterwards the trainable weights are the LoRA matrices `lora_kernel_a`,
    `lora_kernel_b` of every target and the kernel and bias of the head
    `predictions`; every other weight (target kernels and biases included) is
    frozen. Compile the model afterwards, as Keras requires.

    Args:
        model: a built CaiT classifier with a head `predictions`, e.g. from
            `with_new_head`.
        rank: the rank of the update, a positive integer (4 to 16 is usual; a numpy
            integer too).
        targets: names of the Dense layers to adapt (see the module docstring);
            by default every attention projection.
        alpha: the scale numerator, `W + (alpha / rank) · A B`, a positive number as
            in the paper, loralib and peft (0 would add nothing, a negative one flip
            the update's sign); by default `rank` (scale 1), as Keras does.

    Returns `model`, changed in place; a call that raises changes nothing (every
    target is checked before any is adapted).
    """
    check_model_object(model, "enable_lora")
    rank = checked_count("rank", rank, 8)
    if alpha is not None:
        allowed = ["e.g. ", Named("alpha", 2 * rank), ", or leave ", Named("alpha"), " out for ", Named("alpha", rank)]
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
            raise ArgumentError("alpha", alpha, f"must be a positive number, not {type(alpha).__name__}", allowed,
                                usage=True)
        if alpha == float("inf"):  # every update inf, the weights NaN
            raise ArgumentError("alpha", alpha, "must be a finite number: the update is scaled by alpha / rank",
                                allowed, usage=True)
        if not alpha > 0:  # NaN too
            raise ArgumentError("alpha", alpha, "must be positive: the update is scaled by alpha / rank, so 0 adds "
                                "nothing and a negative alpha flips its sign", allowed, usage=True)
        alpha = int(alpha) if isinstance(alpha, numbers.Integral) else float(alpha)
    # None or a number used to fail on `tuple()` with a bare TypeError.
    given = targets
    try:
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
    except TypeError:
        targets = None
    if targets is None or not all(isinstance(name, str) for name in targets):
        raise ArgumentError("targets", given, "must be the name of a Dense layer or a list of such names",
                            ["e.g. ", Named("targets", ("qkv", "output_projection")), ", or leave ",
                             Named("targets"), " out for every attention projection"], usage=True)
    check_has_head(model)
    if HEAD_NAME in targets:
        raise ArgumentError("targets", given, f"the head '{HEAD_NAME}' is trained in full, not through LoRA",
                            ["leave it out, e.g. ", Named("targets", ATTENTION_PROJECTIONS)], usage=True)
    layers = _sublayers(model)
    dense_names = sorted({l.name for l in layers if isinstance(l, keras.layers.Dense)} - {HEAD_NAME})
    unknown = [name for name in targets if name not in dense_names]
    if unknown or not targets:
        raise ArgumentError("targets", given, f"{unknown or 'empty'} names no Dense layer of '{model.name}'",
                            f"choose among {dense_names}", usage=True)
    adapted = [layer for layer in layers if isinstance(layer, keras.layers.Dense) and layer.name in targets]
    for layer in adapted:  # all checked before any is changed: a refused call leaves the model as it was
        if layer.lora_enabled:
            raise ArgumentError("model", model, f"'{layer.path}' already has LoRA", "call enable_lora once per "
                                "model", usage=True, shown=f"<{model.name}>")
    for layer in adapted:
        layer.enable_lora(rank, lora_alpha=alpha)
    head = model.get_layer(HEAD_NAME)
    head_weights = {id(weight) for weight in head.weights}
    for weight in model.weights:
        weight.trainable = id(weight) in head_weights or weight.path.endswith(
            ("/lora_kernel_a", "/lora_kernel_b")
        )
    # Layers stay trainable so that the variables' own flags decide.
    model.trainable = True
    return model


def lora_weights(model):
    """The LoRA matrices of `model` (A and B of every adapted Dense), e.g. to count them."""
    return [w for w in model.weights if w.path.endswith(("/lora_kernel_a", "/lora_kernel_b"))]
