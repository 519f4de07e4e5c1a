"""keras_cait.models.surgery: a new head, a frozen then unfrozen backbone, another resolution or
dtype policy, LoRA merged."""

import keras
import numpy as np
import pytest

from keras_cait.errors import ArgumentError
from keras_cait.layers.position_embedding import resize_position_embedding
from keras_cait.models.surgery import at_resolution, set_backbone_trainable, with_new_head
from keras_cait.training import Augmentation, adamw, sources, stream, warmup_cosine


def test_new_head_shares_the_backbone_and_is_float32_under_mixed_precision(tiny_cait, policy):
    policy("mixed_bfloat16")
    backbone = tiny_cait(include_top=False, pooling="token")
    model = with_new_head(backbone, classes=7)
    assert model.output_shape == (None, 7)
    assert model.get_layer("patch_embedding") is backbone.get_layer("patch_embedding")
    assert model.get_layer("predictions").compute_dtype == "float32"
    images = np.zeros((2, 32, 32, 3), "float32")
    assert model(images).dtype == "float32"

    replaced = with_new_head(tiny_cait(classes=1000), classes=3)  # a full classifier works too
    assert replaced.output_shape == (None, 3)
    with pytest.raises(ValueError, match="pooling='token' or pooling='avg'"):
        with_new_head(tiny_cait(include_top=False), classes=3)


def test_a_new_head_s_model_takes_the_name_given_or_keeps_its_own_and_refuses_one_keras_cannot_take(tiny_cait):
    # Before: name='' silently kept the model's own name; 5 and 'a/b' were Keras' ValueError about `name`.
    backbone = tiny_cait(include_top=False, pooling="token")
    assert with_new_head(backbone, 3, name="flowers").name == "flowers"
    assert with_new_head(backbone, 3).name == backbone.name
    for name in ("", " ", 5, "runs/flowers"):
        with pytest.raises(ArgumentError, match=rf"^name={name!r}: must be a model's name: a str, not empty, without "
                                                r"'/'; e\.g\. name='flowers', or leave it out for the model's own$"):
            with_new_head(backbone, 3, name=name)


def test_a_new_head_takes_the_dtype_of_the_features_it_reads_not_the_global_policy(tiny_cait, policy):
    float32 = tiny_cait(include_top=False, pooling="token")
    mixed = tiny_cait(include_top=False, pooling="token", dtype="mixed_float16")
    policy("bfloat16")  # the caller's global policy, which neither model was built under

    assert with_new_head(float32, 3).get_layer("predictions").dtype_policy.name == "float32"
    assert with_new_head(mixed, 3).get_layer("predictions").dtype_policy.name == "float32"  # as build_cait's
    assert with_new_head(tiny_cait(include_top=False, pooling="token", dtype="bfloat16"), 3).get_layer(
        "predictions").dtype_policy.name == "bfloat16"


def test_freezing_trains_the_head_only(tiny_cait):
    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=3)
    set_backbone_trainable(model, False)
    assert [v.path for v in model.trainable_weights] == ["predictions/kernel", "predictions/bias"]
    set_backbone_trainable(model, True)
    # Every weight but the pre-softmax head mixes' biases, which the softmax cancels (never trained).
    frozen = [v.path for v in model.weights if not any(v is t for t in model.trainable_weights)]
    assert frozen == [f"self_attention_block_{i}/attention/pre_softmax_head_mix/bias" for i in range(2)]
    with pytest.raises(ValueError, match="has no head layer 'predictions'"):
        set_backbone_trainable(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]), False)


def test_a_frozen_backbone_stays_frozen_through_save_load_and_clone(tiny_cait, tmp_path):
    """The blocks make their sublayers in `build`, after Keras set `trainable=False` from the saved
    config: the loaded or cloned model trained every block again, and freezing it once more did
    nothing on TensorFlow (its tracking skips `layer.trainable = False` where the flag is False)."""
    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=3)
    set_backbone_trainable(model, False)
    model.save(tmp_path / "frozen.keras")
    head = ["predictions/kernel", "predictions/bias"]
    for copy in (keras.models.load_model(tmp_path / "frozen.keras"), keras.models.clone_model(model)):
        assert [v.path for v in copy.trainable_weights] == head
        copy.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy")
        before = [w.copy() for w in copy.get_weights()]
        copy.train_on_batch(np.random.RandomState(0).uniform(0, 255, (2, 32, 32, 3)), np.eye(3)[[0, 1]])
        changed = [v.path for v, old in zip(copy.weights, before) if not np.array_equal(v.numpy(), old)]
        assert changed == head
        set_backbone_trainable(copy, True)
        set_backbone_trainable(copy, False)  # the flag False already on each layer: the sublayers follow
        assert [v.path for v in copy.trainable_weights] == head


@pytest.mark.parametrize("trainable", ["yes", "False", 2, None])
def test_freezing_takes_a_bool_and_a_model_naming_what_it_was_given(tiny_cait, trainable):
    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=3)
    with pytest.raises(ValueError, match=rf"^trainable={trainable!r}: must be True \(unfreeze\) or False \(freeze\)"):
        set_backbone_trainable(model, trainable)
    assert len(model.trainable_weights) > 2  # nothing frozen by the refused call
    set_backbone_trainable(model, np.bool_(False))
    assert [v.path for v in model.trainable_weights] == ["predictions/kernel", "predictions/bias"]
    with pytest.raises(ValueError, match="^model='model.keras': set_backbone_trainable takes a Keras model, not a name"):
        set_backbone_trainable("model.keras", True)
    headless = tiny_cait(include_top=False, pooling="token")
    with pytest.raises(ValueError, match=rf"^model=<{headless.name}>: has no head layer 'predictions' to keep "
                       r"training; give it one first: with_new_head\(model, classes\)$") as refused:
        set_backbone_trainable(headless, False)
    assert refused.value.argument == "model" and all(layer.trainable for layer in headless.layers)


def _model_takers():
    from keras_cait.inspection import feature_extractor, forward_intermediates
    from keras_cait.models.surgery import merge_lora, with_drop_path_rate, with_dtype_policy
    from keras_cait.training import enable_lora

    return {
        "with_new_head": lambda model: with_new_head(model, 3),
        "at_resolution": lambda model: at_resolution(model, 64),
        "with_dtype_policy": lambda model: with_dtype_policy(model, "mixed_bfloat16"),
        "with_drop_path_rate": lambda model: with_drop_path_rate(model, 0.1),
        "merge_lora": merge_lora,
        "enable_lora": lambda model: enable_lora(model, 4),
        "adamw": lambda model: adamw(model, 1e-3),
        "feature_extractor": feature_extractor,
        "forward_intermediates": lambda model: forward_intermediates(model, np.zeros((1, 32, 32, 3))),
    }


def test_at_resolution_of_a_model_that_is_no_cait_names_it():
    """A bare StopIteration, without a message."""
    from keras_cait.errors import ArgumentError
    from keras_cait.models.surgery import at_resolution

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="dense_only")
    with pytest.raises(ArgumentError) as refused:
        at_resolution(model, 64)
    assert str(refused.value) == ("model=<dense_only>: 'dense_only' has no PatchEmbedding layer: it is not a CaiT at "
                                  "the top level; give a CaiT (keras_cait.CaiT_* or load_classifier), not a model "
                                  "that wraps one")


@pytest.mark.parametrize("taker", list(_model_takers()))
def test_a_function_that_takes_a_model_given_a_path_says_to_load_it(taker):
    call = _model_takers()[taker]
    with pytest.raises(ValueError, match=rf"^model='best.keras': {taker} takes a Keras model, not a name or a path; "
                                         r"load it first: keras_cait.models.load_classifier\('best.keras'\)$"):
        call("best.keras")
    with pytest.raises(ValueError, match=rf"^model=<NoneType>: {taker} takes a Keras model, not a NoneType"):
        call(None)


def test_a_rate_or_policy_a_copy_cannot_take_is_refused_by_its_own_name(tiny_cait):
    from keras_cait.models.surgery import with_drop_path_rate, with_dtype_policy

    model = tiny_cait()
    with pytest.raises(ValueError, match=r"^rate='0.1': must be a number in \[0, 1\), not str; e.g. 0.1$"):
        with_drop_path_rate(model, "0.1")
    with pytest.raises(ValueError, match=r"^rate=-1: must be a number in \[0, 1\)"):  # was StochasticDepth's rate=-1.0
        with_drop_path_rate(model, -1)
    with pytest.raises(ValueError, match=r"^policy='bf16': not a Keras dtype policy; give float32, mixed_float16") \
            as refused:
        with_dtype_policy(model, "bf16")
    # One traceback in a notebook: Keras' own error is kept as `cause`, not chained.
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert "bf16" in str(refused.value.cause)
    assert with_dtype_policy(model, None) is model  # the global policy, float32, as before
    for make in (lambda: tiny_cait(classifier_activation="sofmax"),
                 lambda: with_new_head(tiny_cait(include_top=False, pooling="token"), 3, "sofmax")):
        with pytest.raises(ValueError, match=r"^classifier_activation='sofmax': not a Keras activation; e.g. "
                                             r"'softmax', or None for logits$"):
            make()  # was Keras' "Could not interpret activation function identifier: sofmax"


def test_a_higher_resolution_copy_resizes_the_position_embedding(tiny_cait):
    model = with_new_head(tiny_cait(include_top=False, pooling="token"), classes=3)
    bigger = at_resolution(model, 64)
    assert bigger.input_shape == (None, 64, 64, 3) and bigger.output_shape == (None, 3)
    for old, new in zip(model.weights, bigger.weights):
        assert old.path == new.path
        if old.path == "position_embedding/embeddings":
            assert new.shape == (1, 16, 64)
            expected = resize_position_embedding(np.asarray(old), (4, 4))
            np.testing.assert_allclose(np.asarray(new), expected, rtol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(new), np.asarray(old))
    with pytest.raises(ValueError, match="multiple of the patch size 16; e.g. image_size=48"):
        at_resolution(model, 50)


def _fit(model, source, epochs, learning_rate, batch_size=32):
    steps = stream.steps_per_epoch(source, batch_size)
    model.compile(
        optimizer=adamw(model, warmup_cosine(learning_rate, epochs * steps, 0)),
        loss="categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=4,
    )
    # Digits keep their meaning only unflipped and little cropped.
    augmentation = Augmentation(
        16, source.num_classes, scale=(0.7, 1.0), horizontal_flip=False, rand_augment_magnitude=0,
        random_erasing=0, mixup_alpha=0, cutmix_alpha=0, repeats=1,
    )
    batches = stream.training_stream(source, augmentation, batch_size, epochs, seed=0)
    model.fit(batches, epochs=epochs, steps_per_epoch=steps, verbose=0)


@pytest.mark.large
def test_transfer_to_new_classes_of_a_real_image_folder(tiny_cait, digits, tmp_path):
    """Pretrain on the digits 0-4, then learn 5-9: the head on the frozen backbone, then all."""
    keras.utils.set_random_seed(0)
    pretraining = sources.image_folder(digits(tmp_path / "first", classes=range(5)))
    backbone = tiny_cait(input_shape=(16, 16, 3), patch_size=4, include_top=False, pooling="token")
    _fit(with_new_head(backbone, 5), pretraining, epochs=10, learning_rate=3e-3)

    train, held_out = sources.split(sources.image_folder(digits(tmp_path / "second", classes=range(5, 10))),
                                    0.3, seed=0)
    model = with_new_head(backbone, train.num_classes)
    set_backbone_trainable(model, False)
    frozen = [np.array(w) for w in backbone.weights]
    _fit(model, train, epochs=3, learning_rate=1e-2)
    assert all(np.array_equal(a, np.array(b)) for a, b in zip(frozen, backbone.weights))

    set_backbone_trainable(model, True)
    _fit(model, train, epochs=3, learning_rate=1e-3)
    assert not all(np.array_equal(a, np.array(b)) for a, b in zip(frozen, backbone.weights))
    evaluation = stream.evaluation_dataset(held_out, 16, 64, one_hot=True)
    accuracy = model.evaluate(evaluation, verbose=0, return_dict=True)["accuracy"]
    assert accuracy > 0.6  # 5 classes: chance is 0.2


@pytest.mark.parametrize("image_size", [-16, 0, 48.0, True, "64"])
def test_at_resolution_names_a_size_that_is_not_a_positive_integer(tiny_cait, image_size):
    with pytest.raises(ValueError, match=f"image_size={image_size!r}: must be a positive integer"):
        at_resolution(tiny_cait(), image_size)


def test_at_resolution_of_a_lora_model_says_to_merge_first(tiny_cait):
    from keras_cait.training import enable_lora, merge_lora

    model = tiny_cait()
    enable_lora(model, rank=2)

    with pytest.raises(ValueError, match=r"^model=<\w+>: has LoRA weights.*at_resolution\(merge_lora\(model\), 64\)"):
        at_resolution(model, 64)
    assert at_resolution(merge_lora(model), 64).input_shape == (None, 64, 64, 3)
    # with_dtype_policy (load_classifier's dtype=) failed in Keras' set_weights, counting weights.
    from keras_cait.models import with_dtype_policy

    with pytest.raises(ValueError, match=r"^model=<\w+>: has LoRA weights, which with_dtype_policy does not carry "
                                         r"over; merge them first: with_dtype_policy\(merge_lora\(model\), "
                                         r"'mixed_bfloat16'\)"):
        with_dtype_policy(model, "mixed_bfloat16")
    assert with_dtype_policy(model, "float32") is model  # nothing to rebuild


@pytest.mark.parametrize("kind, policy", [("new_head", "mixed_bfloat16"), ("new_head", "mixed_float16"),
                                          ("top", "mixed_bfloat16"), ("avg", "mixed_float16")])
def test_a_float32_model_rebuilt_under_a_mixed_policy_computes_as_one_built_under_it(tiny_cait, policy, kind,
                                                                                      tmp_path):
    """Which layers stay float32 is decided once (`keras_cait.models.precision.layer_dtype`): `build_cait`,
    `with_new_head` and `with_dtype_policy` agree on every layer, and a model already under a policy
    is recognised as such (returned as it is)."""
    from keras_cait.training import with_dtype_policy

    build = {"new_head": lambda: with_new_head(tiny_cait(include_top=False, pooling="token"), 3),
             "top": tiny_cait, "avg": lambda: tiny_cait(include_top=False, pooling="avg")}[kind]
    build().save(tmp_path / "float32.keras")
    keras.mixed_precision.set_global_policy(policy)
    try:
        built = build()
        loaded = keras.models.load_model(tmp_path / "float32.keras")
        rebuilt = with_dtype_policy(loaded, policy)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    policies = lambda model: [(layer.name, layer.dtype_policy.name) for layer in model.layers  # noqa: E731
                              if not isinstance(layer, keras.layers.InputLayer)]  # the global one when built
    assert policies(rebuilt) == policies(built) != policies(loaded)
    for old, new in zip(loaded.weights, rebuilt.weights):
        np.testing.assert_array_equal(np.asarray(old), np.asarray(new))
    assert with_dtype_policy(built, policy) is built
    assert with_dtype_policy(loaded, "float32") is loaded
    assert policies(with_dtype_policy(built, "float32")) == policies(loaded)


def test_copies_and_exports_leave_python_s_generator_where_it_was(tiny_cait, tmp_path):
    """Keras draws a seed from Python's `random` for each stochastic-depth layer it builds; a copy
    (another policy, resolution or rate, LoRA merged) takes the original's weights, so it leaves the
    caller's generator as it was, and so does an export of a mixed-precision model (folded from its
    float32 copy): a run seeded before them draws what it would have drawn without them."""
    import random

    from keras_cait import export_saved_model
    from keras_cait.models.surgery import merge_lora, with_drop_path_rate, with_dtype_policy

    model = tiny_cait(drop_path_rate=0.1)
    mixed = with_dtype_policy(model, "mixed_bfloat16")
    calls = {
        "with_dtype_policy": lambda: with_dtype_policy(model, "mixed_bfloat16"),
        "at_resolution": lambda: at_resolution(model, 64),
        "with_drop_path_rate": lambda: with_drop_path_rate(model, 0.2),
        "merge_lora": lambda: merge_lora(model),
        "export_saved_model": lambda: export_saved_model(mixed, tmp_path / "serving" / "1"),
    }
    for name, call in calls.items():
        random.seed(5)
        call()
        drawn = random.random()
        random.seed(5)
        assert drawn == random.random(), f"{name} drew from Python's generator"


@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_a_model_quantized_by_keras_saves_loads_saves_again_and_is_rebuilt_quantized(tiny_cait, tmp_path, mode):
    """A block's config held its own policy only: the .keras file of a model.quantize()d CaiT did not
    load ("expected 2 variables, but received 3"), a loaded one did not save again, and the rebuilds
    raised Keras' set_weights count or shape errors."""
    from keras_cait.models.surgery import merge_lora, with_drop_path_rate, with_dtype_policy

    model = tiny_cait(classes=3)
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    model.quantize(mode)
    expected = model.predict(images, verbose=0)

    model.save(tmp_path / "quantized.keras")
    loaded = keras.models.load_model(tmp_path / "quantized.keras")
    loaded.save(tmp_path / "again.keras")
    again = keras.models.load_model(tmp_path / "again.keras")
    for rebuilt in (loaded, again, at_resolution(model, 32), with_drop_path_rate(model, 0.1), merge_lora(model)):
        dense = [layer for layer in rebuilt._flatten_layers() if isinstance(layer, keras.layers.Dense)]
        assert {layer.quantization_mode for layer in dense} == {mode}
        np.testing.assert_array_equal(rebuilt.predict(images, verbose=0), expected)
    assert {layer.quantization_mode for layer in at_resolution(model, 48)._flatten_layers()
            if isinstance(layer, keras.layers.Dense)} == {mode}

    with pytest.raises(ArgumentError, match=f"is quantized \\({mode}: model.quantize\\).*change the float model's "
                                            "policy, then quantize the result") as raised:
        with_dtype_policy(model, "mixed_bfloat16")
    assert raised.value.argument == "model"
