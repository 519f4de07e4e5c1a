"""LoRA fine-tuning: only the LoRA matrices and the head learn; the merged model serves the same."""

import keras
import numpy as np
import pytest

from keras_cait.training import with_new_head
from keras_cait.training.lora import enable_lora, lora_weights, merge_lora

CLASSES = 3


def _lora_model(tiny_cait, **lora):
    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=CLASSES)
    return enable_lora(model, **{"rank": 2, **lora})


def _fit(model, steps=3):
    rng = np.random.RandomState(0)
    images = rng.uniform(0, 255, (8, 32, 32, 3)).astype("float32")
    labels = rng.randint(0, CLASSES, 8)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(images, labels, batch_size=4, epochs=steps // 2 + 1, verbose=0)
    return images


@pytest.mark.large
def test_only_lora_and_head_weights_change_in_a_fit(tiny_cait):
    model = _lora_model(tiny_cait)
    adapted = {w.path for w in lora_weights(model)}
    # Every attention projection of both block kinds is adapted: A and B each.
    assert {path.rsplit("/", 2)[1] for path in adapted} == {"qkv", "query", "key", "value", "output_projection"}
    head = {"predictions/kernel", "predictions/bias"}
    assert {w.path for w in model.trainable_weights} == adapted | head
    before = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    _fit(model)
    changed = {
        w.path for w in model.weights if not np.array_equal(before[w.path], keras.ops.convert_to_numpy(w))
    }
    assert changed - adapted - head == set()
    # B starts at zero, so every adapted layer has learnt a non-zero update.
    assert {p for p in adapted if p.endswith("lora_kernel_b")} <= changed
    assert head <= changed


@pytest.mark.large
def test_merged_model_is_a_plain_cait_with_the_same_outputs_and_serves_them(tiny_cait, tmp_path):
    import tensorflow as tf

    from keras_cait.export import export_saved_model

    model = _lora_model(tiny_cait, alpha=6)
    images = _fit(model)
    merged = merge_lora(model)
    plain = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=CLASSES)
    assert [w.path for w in merged.weights] == [w.path for w in plain.weights]
    expected = model.predict(images, verbose=0)
    np.testing.assert_allclose(merged.predict(images, verbose=0), expected, rtol=1e-5, atol=1e-6)
    # The update is alpha/rank · A B: a wrong scale would move the outputs.
    qkv = "self_attention_block_0/attention/qkv"
    weights = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    merged_kernel = {w.path: keras.ops.convert_to_numpy(w) for w in merged.weights}[f"{qkv}/kernel"]
    update = 6 / 2 * weights[f"{qkv}/lora_kernel_a"] @ weights[f"{qkv}/lora_kernel_b"]
    assert np.abs(update).max() > 1e-3
    np.testing.assert_allclose(merged_kernel, weights[f"{qkv}/kernel"] + update, rtol=1e-5, atol=1e-6)

    path = tmp_path / "lora" / "1"
    export_saved_model(merged, path, class_names=["a", "b", "c"], top_k=2)
    served = tf.saved_model.load(str(path)).signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_bad_lora_arguments_are_refused_with_the_fix(tiny_cait):
    def model():
        return with_new_head(tiny_cait(include_top=False, pooling="token"), classes=CLASSES)

    with pytest.raises(ValueError, match=r"rank=0: must be a positive integer"):
        enable_lora(model(), rank=0)
    with pytest.raises(ValueError, match=r"\['attn'\] names no Dense layer.*choose among \[.*'qkv'"):
        enable_lora(model(), rank=4, targets=("qkv", "attn"))
    with pytest.raises(ValueError, match="head 'predictions' is trained in full"):
        enable_lora(model(), rank=4, targets=("qkv", "predictions"))
    with pytest.raises(ValueError, match="no 'predictions' head"):
        enable_lora(tiny_cait(include_top=False, pooling="token"), rank=4)
    twice = enable_lora(model(), rank=4)
    with pytest.raises(ValueError, match="already has LoRA"):
        enable_lora(twice, rank=4)
