"""The config of a layer that makes its sublayers in `build` keeps what `model.quantize` made of them.

Keras' `model.quantize("int8")` quantizes each Dense inside a CaiT block and gives it a quantized
dtype policy, but a layer's config holds its own policy only: saved so, a block loaded its Dense
layers unquantized and refused their int8 variables ("expected 2 variables, but received 3"), and
the `.keras` file of a quantized CaiT could not be loaded. The config's `dtype` is then a
`keras.dtype_policies.DTypePolicyMap` instead: the layer's own policy, and the quantized sublayers'
by path, which the layer passes down as it builds them (as keras-hub's backbones keep theirs), each
Dense given its own entry (`sublayer_policy`).
"""

import keras


def _entry(policy, path):
    """`policy`, or its entry for `path` where it is a `DTypePolicyMap`."""
    return policy[path] if isinstance(policy, keras.dtype_policies.DTypePolicyMap) else policy


def _policy_of(layer):
    """`layer`'s own policy: its entry where it was built with a map."""
    return _entry(layer.dtype_policy, layer.path)


def with_quantized_sublayers(layer, config):
    """`config` (the layer's `get_config()`) with `dtype` the map of its quantized sublayers' policies
    over its own, where any is quantized; as it is otherwise."""
    quantized = {sublayer.path: _policy_of(sublayer) for sublayer in layer._flatten_layers(include_self=False)
                 if sublayer.quantization_mode is not None}
    if not quantized:
        return config
    policies = keras.dtype_policies.DTypePolicyMap(default_policy=_policy_of(layer))
    for path, policy in quantized.items():
        policies[path] = policy
    return {**config, "dtype": keras.saving.serialize_keras_object(policies)}


def sublayer_policy(layer, name):
    """The policy `layer` builds its Dense sublayer `name` with: its own, or, where that is a
    `DTypePolicyMap`, the map's entry for the sublayer's path. A Dense holding the whole map computes
    as it should, but Keras' `Dense.save_own_variables` reads the map's own quantization mode (its
    default's, none), and a quantized model loaded from its file could not be saved again."""
    return _entry(layer.dtype_policy, f"{layer.path}/{name}")
