"""A shared test harness in the spirit of keras-hub's `TestCase.run_layer_test` / `run_backbone_test`.

`run_layer_test` checks what every Keras layer of keras_cait must do, so that a
layer's own test file only says what is special about it:

- config round-trip: `from_config(get_config())` has the same config;
- `.keras` save/load: the layer inside a functional model, saved and loaded,
  gives the same outputs (its weights and its config survive);
- `compute_output_shape` (symbolic call) matches the shape of the real call;
- `mixed_bfloat16`: the layer computes in bfloat16 and keeps float32 variables;
- `jit_compile`: the call under XLA gives the eager outputs.
"""

import keras
import numpy as np


def _numpy(tree):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, tree)


def _assert_close(actual, expected, atol):
    """Within `atol` relative to the largest value (XLA fuses and reorders float32 sums)."""
    for got, want in zip(keras.tree.flatten(actual), keras.tree.flatten(expected)):
        np.testing.assert_allclose(got, want, atol=atol * max(1.0, float(np.max(np.abs(want)))), rtol=0)


def _inputs_like(data):
    return keras.tree.map_structure(lambda x: keras.Input(batch_shape=x.shape, dtype=str(x.dtype)), data)


def run_layer_test(layer_class, init_kwargs, data, tmp_path, call_kwargs=None, atol=1e-5, mixed_precision=True):
    """Runs the harness on `layer_class(**init_kwargs)` called on `data` (arrays, or a list/dict of them)."""
    call_kwargs = call_kwargs or {}
    layer = layer_class(**init_kwargs)
    expected = _numpy(layer(data, **call_kwargs))

    config = layer.get_config()
    assert layer_class.from_config(config).get_config() == config

    symbolic = layer(_inputs_like(data), **call_kwargs)
    got_shapes = [tuple(x.shape[1:]) for x in keras.tree.flatten(symbolic)]
    want_shapes = [tuple(x.shape[1:]) for x in keras.tree.flatten(expected)]
    assert got_shapes == want_shapes, f"{layer_class.__name__}: symbolic {got_shapes} != real {want_shapes}"

    inputs = _inputs_like(data)
    model = keras.Model(inputs, layer(inputs, **call_kwargs))
    path = str(tmp_path / f"{layer_class.__name__}.keras")
    model.save(path)
    _assert_close(_numpy(keras.saving.load_model(path)(data)), expected, atol)

    jitted = keras.Model(inputs, layer(inputs, **call_kwargs))
    jitted.compile(jit_compile=True)
    _assert_close(_numpy(jitted.predict_on_batch(data)), expected, atol)

    if mixed_precision:
        half = layer_class(**init_kwargs, dtype="mixed_bfloat16")
        outputs = half(data, **call_kwargs)
        assert half.compute_dtype == "bfloat16"
        assert all(weight.dtype == "float32" for weight in half.weights)
        dtypes = {keras.backend.standardize_dtype(x.dtype) for x in keras.tree.flatten(outputs)}
        assert dtypes <= {"bfloat16", "float32"}, dtypes
    return expected


def run_model_test(model_builder, images, tmp_path, atol=1e-5):
    """The harness for a whole model: config round-trip, .keras save/load, jit, mixed_bfloat16."""
    model = model_builder()
    expected = _numpy(model(images, training=False))
    clone = model.__class__.from_config(model.get_config())
    assert [layer.name for layer in clone.layers] == [layer.name for layer in model.layers]
    path = str(tmp_path / "model.keras")
    model.save(path)
    _assert_close(_numpy(keras.saving.load_model(path)(images, training=False)), expected, atol)
    model.compile(jit_compile=True)
    _assert_close(model.predict_on_batch(images), expected, atol)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half = model_builder()
        assert all(weight.dtype == "float32" for weight in half.weights)
        assert any(layer.compute_dtype == "bfloat16" for layer in half.layers)
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(keras.ops.cast(half(images), "float32"))))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return expected
