"""LoRA fine-tuning: only the LoRA matrices and the head learn; the merged model serves the same."""

import keras
import numpy as np
import pytest

from keras_cait.errors import ArgumentError
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
    # These three were bare ValueErrors, which `except ArgumentError` missed.
    with pytest.raises(ArgumentError, match=r"^targets=\('qkv', 'attn'\): \['attn'\] names no Dense layer of '\w+'; "
                                            r"choose among \[.*'qkv'") as refused:
        enable_lora(model(), rank=4, targets=("qkv", "attn"))
    assert refused.value.argument == "targets"
    with pytest.raises(ArgumentError, match=r"^targets=\('qkv', 'predictions'\): the head 'predictions' is trained in "
                                            r"full, not through LoRA; leave it out, e\.g\. targets="):
        enable_lora(model(), rank=4, targets=("qkv", "predictions"))
    with pytest.raises(ValueError, match="has no head layer 'predictions'"):
        enable_lora(tiny_cait(include_top=False, pooling="token"), rank=4)
    twice = enable_lora(model(), rank=4)
    with pytest.raises(ArgumentError, match=r"^model=<\w+>: '.*' already has LoRA; call enable_lora once per model$"):
        enable_lora(twice, rank=4)


@pytest.mark.parametrize("alpha, line", [
    (-1, "alpha=-1: must be positive: the update is scaled by alpha / rank, so 0 adds nothing and a negative alpha "
         "flips its sign; e.g. alpha=8, or leave alpha out for alpha=4"),
    (0, "alpha=0: must be positive: the update is scaled by alpha / rank, so 0 adds nothing and a negative alpha "
        "flips its sign; e.g. alpha=8, or leave alpha out for alpha=4"),
    ("8", "alpha='8': must be a positive number, not str; e.g. alpha=8, or leave alpha out for alpha=4"),
])
def test_an_alpha_that_is_no_positive_number_is_refused_naming_alpha(tiny_cait, alpha, line):
    """-1 used to be taken, and silently turned every update around (W - (1/4) A B); 0 to add nothing."""
    from keras_cait.errors import ArgumentError

    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=CLASSES)
    with pytest.raises(ArgumentError) as refused:
        enable_lora(model, rank=4, alpha=alpha)
    assert (refused.value.argument, refused.value.value, refused.value.usage) == ("alpha", alpha, True)
    assert str(refused.value) == line
    assert lora_weights(model) == []


def test_a_numpy_integer_rank_and_alpha_are_taken_as_ints(tiny_cait):
    """np.int64(4) used to be refused as "must be a positive integer"."""
    import json

    model = _lora_model(tiny_cait, rank=np.int64(4), alpha=np.float32(8.0))
    qkv = model.get_layer("self_attention_block_0").attention.qkv
    assert (qkv.lora_rank, qkv.lora_alpha) == (4, 8.0)
    assert type(qkv.lora_rank) is int and type(qkv.lora_alpha) is float
    json.dumps(qkv.get_config())  # a numpy number in the config would not write
    with pytest.raises(ValueError, match=r"rank=True: must be a positive integer, not bool; e\.g\. rank=8"):
        _lora_model(tiny_cait, rank=True)


def _lora_layers(model):
    from keras_cait.training.lora import _sublayers

    return sorted(layer.path for layer in _sublayers(model) if isinstance(layer, keras.layers.Dense)
                  and layer.lora_enabled)


@pytest.mark.parametrize("first", ["qkv", "value"])
def test_a_refused_second_call_leaves_the_model_as_it_was(tiny_cait, first):
    """The layers were adapted one by one until the first with LoRA already: a refused call left
    some of them adapted (qkv first: one more layer, value first: five more)."""
    model = _lora_model(tiny_cait, rank=4, targets=first)
    adapted, trainable = _lora_layers(model), {w.path for w in model.trainable_weights}
    assert adapted
    with pytest.raises(ValueError, match="already has LoRA"):
        enable_lora(model, rank=4)
    assert _lora_layers(model) == adapted
    assert {w.path for w in model.trainable_weights} == trainable


@pytest.mark.parametrize("targets", [None, 5, ("qkv", 3)])
def test_targets_that_are_no_layer_names_are_refused_naming_targets(tiny_cait, targets):
    """None and 5 used to fail on `tuple(targets)` with a bare TypeError."""
    from keras_cait.errors import ArgumentError

    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=CLASSES)
    with pytest.raises(ArgumentError, match=r"^targets=.*: must be the name of a Dense layer or a list of such "
                       r"names; e\.g\. targets=\('qkv', 'output_projection'\), or leave targets out") as refused:
        enable_lora(model, rank=4, targets=targets)
    assert refused.value.argument == "targets"
    assert lora_weights(model) == []
    assert lora_weights(enable_lora(model, rank=4, targets=iter(["qkv"])))  # any iterable of names still works


def test_an_infinite_alpha_is_refused_naming_alpha(tiny_cait):
    """inf used to be taken: every update inf, the weights NaN after the first step."""
    from keras_cait.errors import ArgumentError

    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=CLASSES)
    with pytest.raises(ArgumentError, match=r"^alpha=inf: must be a finite number: the update is scaled by "
                       r"alpha / rank; e\.g\. alpha=8") as refused:
        enable_lora(model, rank=4, alpha=float("inf"))
    assert refused.value.argument == "alpha"


def test_freezing_or_unfreezing_the_backbone_of_a_lora_model_is_refused(tiny_cait):
    """`set_backbone_trainable(model, True)` made the class token, position embedding and final norm
    trainable while the blocks' kernels stayed frozen: neither LoRA nor a full fine-tuning."""
    from keras_cait.errors import ArgumentError
    from keras_cait.training import set_backbone_trainable

    model = enable_lora(with_new_head(tiny_cait(include_top=False, pooling="token"), 3), rank=2)
    trainable = [v.path for v in model.trainable_weights]
    for value in (True, False):
        with pytest.raises(ArgumentError) as refused:
            set_backbone_trainable(model, value)
        assert str(refused.value).startswith(f"model=<{model.name}>: has LoRA (enable_lora)")
        assert str(refused.value).endswith("merge_lora(model) first to fine-tune the whole network")
        assert [v.path for v in model.trainable_weights] == trainable
