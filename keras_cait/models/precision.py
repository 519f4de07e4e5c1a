"""Which dtype each layer of a CaiT computes in: under a mixed policy the residual stream, its
norms and the head stay float32, as timm's AMP keeps them (`layer_dtype`, the one place that says)."""

import keras

from keras_cait.errors import ArgumentError, quietly_caused


def is_mixed(policy):
    """Whether `policy` computes in half precision on float32 variables ("mixed_float16",
    "mixed_bfloat16"; a `DTypePolicyMap` by its default policy). Every decision that depends on
    mixed precision asks this (`float32_if_mixed`, hence `layer_dtype` and `has_dtype_policy`)."""
    policy = keras.dtype_policies.get(policy)
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        policy = policy.default_policy
    return policy.compute_dtype != policy.variable_dtype


def float32_if_mixed(policy):
    """The dtype policy of the residual stream, LayerNorm and head: "float32" under a mixed
    policy, else the name of `policy`.

    Under "mixed_float16" / "mixed_bfloat16" the matmuls run in half precision
    while the normalisation statistics, their gamma/beta and the logits stay in
    float32, as torch.autocast keeps them in the reference's AMP training.
    A `DTypePolicyMap` (per-layer policies, as keras-hub rebuilds a quantized
    model) is returned as it is, or with a float32 default where its default is mixed.
    """
    policy = keras.dtype_policies.get(policy)
    map_policy = isinstance(policy, keras.dtype_policies.DTypePolicyMap)
    if not is_mixed(policy):
        return policy if map_policy else policy.name
    if map_policy:
        return keras.dtype_policies.DTypePolicyMap("float32", dict(policy.items()))
    return "float32"


# The layers of `build_cait` (and the head of `with_new_head`) that compute in float32 under a
# mixed policy: the residual stream's parameters, the final norm, the pooling and the head. Inside
# each block, `_ResidualBlock.build` keeps its norms and LayerScale float32 likewise.
FLOAT32_UNDER_MIXED = ("position_embedding", "class_token", "final_norm", "token_pool", "avg_pool", "predictions")


def layer_dtype(name, policy):
    """The dtype policy of the layer `name` of a CaiT under `policy`: what `build_cait` gives it,
    and what `keras_cait.training.with_dtype_policy` rebuilds it with."""
    return float32_if_mixed(policy) if name in FLOAT32_UNDER_MIXED else policy


def has_dtype_policy(model, policy):
    """Whether every layer of the CaiT `model` has the dtype policy it would have if built under
    `policy` (`layer_dtype`), e.g. `has_dtype_policy(model, "float32")`."""
    return all(
        layer.dtype_policy.name == keras.dtype_policies.get(layer_dtype(layer.name, policy)).name
        for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)
    )


def checked_dtype(dtype, argument="dtype"):
    """`dtype` as a `keras.DTypePolicy` (None stays None), or an `ArgumentError` naming `argument`
    and the policies."""
    if dtype is None:
        return None
    try:
        return keras.dtype_policies.get(dtype)
    except (ValueError, TypeError) as error:
        raise quietly_caused(ArgumentError(
            argument, dtype, "not a Keras dtype policy",
            "give float32, mixed_float16, mixed_bfloat16, bfloat16, float16 or a keras.DTypePolicy", usage=True),
            error) from None
