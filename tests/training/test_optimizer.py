"""AdamW with DeiT's weight decay: kernels decay; biases, norms, LayerScale, pos_embed, cls_token do not."""

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.errors import ArgumentError
from keras_cait.training import adamw, weight_decay_exclusions, with_new_head

# Every variable of build_cait(depth=1, class_attention_depth=1), by what AdamW does with it.
DECAYED = """
    patch_embedding/projection/kernel
    self_attention_block_0/attention/qkv/kernel
    self_attention_block_0/attention/pre_softmax_head_mix/kernel
    self_attention_block_0/attention/post_softmax_head_mix/kernel
    self_attention_block_0/attention/output_projection/kernel
    self_attention_block_0/mlp_dense_1/kernel
    self_attention_block_0/mlp_dense_2/kernel
    class_attention_block_0/attention/query/kernel
    class_attention_block_0/attention/key/kernel
    class_attention_block_0/attention/value/kernel
    class_attention_block_0/attention/output_projection/kernel
    class_attention_block_0/mlp_dense_1/kernel
    class_attention_block_0/mlp_dense_2/kernel
    predictions/kernel
""".split()
NOT_DECAYED = """
    patch_embedding/projection/bias
    position_embedding/embeddings
    self_attention_block_0/attention_norm/gamma
    self_attention_block_0/attention_norm/beta
    self_attention_block_0/attention/qkv/bias
    self_attention_block_0/attention/pre_softmax_head_mix/bias
    self_attention_block_0/attention/post_softmax_head_mix/bias
    self_attention_block_0/attention/output_projection/bias
    self_attention_block_0/attention_layer_scale/gamma
    self_attention_block_0/mlp_norm/gamma
    self_attention_block_0/mlp_norm/beta
    self_attention_block_0/mlp_dense_1/bias
    self_attention_block_0/mlp_dense_2/bias
    self_attention_block_0/mlp_layer_scale/gamma
    class_token/token
    class_attention_block_0/attention_norm/gamma
    class_attention_block_0/attention_norm/beta
    class_attention_block_0/attention/query/bias
    class_attention_block_0/attention/key/bias
    class_attention_block_0/attention/value/bias
    class_attention_block_0/attention/output_projection/bias
    class_attention_block_0/attention_layer_scale/gamma
    class_attention_block_0/mlp_norm/gamma
    class_attention_block_0/mlp_norm/beta
    class_attention_block_0/mlp_dense_1/bias
    class_attention_block_0/mlp_dense_2/bias
    class_attention_block_0/mlp_layer_scale/gamma
    final_norm/gamma
    final_norm/beta
    predictions/bias
""".split()


def decayed_by_one_step(model, learning_rate=0.1, weight_decay=0.5):
    """Paths of the variables that one AdamW step with zero gradients changes.

    With zero gradients Adam's update is 0, so only the decoupled decay
    w <- w (1 - lr · wd) can move a variable.
    """
    optimizer = adamw(model, learning_rate, weight_decay=weight_decay)
    before = {v.path: np.array(v) for v in model.trainable_variables}
    optimizer.apply([keras.ops.zeros_like(v) for v in model.trainable_variables],
                    model.trainable_variables)
    decayed = set()
    for variable in model.trainable_variables:
        after = np.array(variable)
        if not np.array_equal(after, before[variable.path]):
            np.testing.assert_allclose(after, before[variable.path] * (1 - 0.05), rtol=1e-6)
            decayed.add(variable.path)
    return decayed


def test_exactly_the_kernels_decay(tiny_cait):
    model = tiny_cait(depth=1, class_attention_depth=1, classes=10)
    paths = [v.path for v in model.weights]
    assert sorted(paths) == sorted(DECAYED + NOT_DECAYED), "the model's variables changed"
    assert sorted(v.path for v in weight_decay_exclusions(model)) == sorted(NOT_DECAYED)
    assert decayed_by_one_step(model) == set(DECAYED)


def test_a_model_saved_with_its_optimizer_and_loaded_back_decays_the_kernels_only(tiny_cait, tmp_path):
    """Keras keeps no `exclude_from_weight_decay(var_list=...)` in a saved optimizer: loaded back, the
    optimizer decayed the biases, norms, LayerScale gammas, position embedding and class token too."""
    model = tiny_cait(depth=1, class_attention_depth=1, classes=10)
    model.compile(optimizer=adamw(model, 0.1, weight_decay=0.5), loss="categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    model.save(tmp_path / "compiled.keras")
    loaded = keras.models.load_model(tmp_path / "compiled.keras")
    before = {v.path: np.array(v) for v in loaded.trainable_variables}
    loaded.optimizer.apply([keras.ops.zeros_like(v) for v in loaded.trainable_variables], loaded.trainable_variables)
    decayed = {v.path for v in loaded.trainable_variables if not np.array_equal(np.array(v), before[v.path])}
    assert decayed == set(DECAYED)


def test_real_variant_decays_its_kernels_only():
    model = keras_cait.CaiT_XXS24(weights=None)
    paths = [v.path for v in model.weights]
    # patch + position, 24 self-attention blocks, class token, 2 class-attention blocks, head
    assert len(paths) == 3 + 24 * 18 + 1 + 2 * 18 + 4
    excluded = {v.path for v in weight_decay_exclusions(model)}
    assert excluded == {p for p in paths if not p.endswith("/kernel")}
    assert "position_embedding/embeddings" in excluded and "class_token/token" in excluded


def test_a_new_head_on_a_frozen_backbone_keeps_the_exclusions(tiny_cait):
    backbone = tiny_cait(depth=1, class_attention_depth=1, include_top=False, pooling="token")
    model = with_new_head(backbone, classes=3)
    for layer in model.layers[:-1]:
        layer.trainable = False
    excluded = {v.path for v in weight_decay_exclusions(model)}
    assert excluded == set(NOT_DECAYED)  # frozen ones too: right again once unfrozen
    assert decayed_by_one_step(model) == {"predictions/kernel"}


def test_a_nested_backbone_still_excludes_position_and_class_token(tiny_cait):
    backbone = tiny_cait(depth=1, class_attention_depth=1, include_top=False, pooling="token")
    model = keras.Sequential([backbone, keras.layers.Dense(3, name="head")], name="classifier")
    excluded = {v.path for v in weight_decay_exclusions(model)}
    assert excluded == set(NOT_DECAYED) - {"predictions/bias"} | {"classifier/head/bias"}


@pytest.mark.large
def test_deit_defaults_and_unbuilt_model_error():
    model = keras_cait.CaiT_XXS24(weights=None, input_shape=(32, 32, 3))
    optimizer = adamw(model, 1e-3, use_ema=True)
    assert optimizer.weight_decay == 0.05
    assert optimizer.epsilon == 1e-8
    assert optimizer.use_ema and optimizer.ema_momentum == 0.99996
    with pytest.raises(ArgumentError, match=r"^model=<\w+>: has no variables yet, so adamw cannot tell which to "
                                            r"decay; build it first"):
        adamw(keras.Sequential([keras.layers.Dense(2)]), 1e-3)


@pytest.mark.parametrize("setting, value, line", [
    ("weight_decay", -1, "weight_decay=-1: must be a number at least 0; e.g. weight_decay=0.05"),
    ("weight_decay", "0.05", "weight_decay='0.05': must be a number at least 0, not str; e.g. weight_decay=0.05"),
    ("beta_1", 1.0, "beta_1=1.0: must be a number in [0, 1); e.g. beta_1=0.9"),
    ("beta_2", None, "beta_2=None: must be a number in [0, 1), not NoneType; e.g. beta_2=0.999"),
    ("epsilon", -1e-8, "epsilon=-1e-08: must be a number at least 0; e.g. epsilon=1e-08"),
    ("ema_momentum", 1.5, "ema_momentum=1.5: must be a number in [0, 1); e.g. ema_momentum=0.99996"),
    ("global_clipnorm", "1", "global_clipnorm='1': must be a number at least 0, not str; e.g. global_clipnorm=1.0"),
    ("weight_decay", float("inf"), "weight_decay=inf: must be a number at least 0; e.g. weight_decay=0.05"),
])
def test_a_setting_adamw_cannot_take_is_refused_by_its_name(tiny_cait, setting, value, line):
    """Keras' AdamW takes a negative decay, and a str from a config fails at the first step."""
    with pytest.raises(ValueError) as refused:
        adamw(tiny_cait(), 1e-3, **{setting: value})
    assert (refused.value.argument, str(refused.value)) == (setting, line)


@pytest.mark.parametrize("learning_rate, line", [
    (-1.0, "learning_rate=-1.0: must be a number of at least 0; e.g. learning_rate=5e-4"),
    (float("nan"), "learning_rate=nan: must be a number of at least 0; e.g. learning_rate=5e-4"),
    ("1e-3", "learning_rate='1e-3': must be a number or a schedule, not str; e.g. learning_rate=5e-4, or "
             "warmup_cosine(5e-4, total_steps, warmup_steps)"),
])
def test_a_learning_rate_adamw_cannot_take_is_refused_naming_it(tiny_cait, learning_rate, line):
    """-1 and nan were taken (the run diverged, or gave nan losses); '1e-3' was Keras' own error."""
    from keras_cait.errors import ArgumentError

    with pytest.raises(ArgumentError) as refused:
        adamw(tiny_cait(), learning_rate)
    assert (refused.value.argument, str(refused.value)) == ("learning_rate", line)


def test_decay_set_is_timms_param_groups_weight_decay(tiny_cait):
    """timm's own grouping of timm's CaiT (with CaiT's no_weight_decay), mapped onto our
    variables through the checkpoint key map, excludes exactly what we exclude."""
    import timm.models.cait as timm_models  # the [test] extra: missing is an error, not a skip
    from timm.optim import param_groups_weight_decay

    from keras_cait.weights.convert import timm_key_map

    reference = timm_models.Cait(img_size=32, embed_dim=64, depth=2, num_heads=4,
                                 init_values=0.1, num_classes=10)
    groups = param_groups_weight_decay(
        reference, weight_decay=0.05, no_weight_decay_list=reference.no_weight_decay()
    )
    names = {id(parameter): name for name, parameter in reference.named_parameters()}
    timm_no_decay = {names[id(p)] for g in groups if g["weight_decay"] == 0 for p in g["params"]}

    model = tiny_cait(classes=10)
    by_timm_name = {key: variable for key, variable, _ in timm_key_map(model)}
    assert set(by_timm_name) == set(names.values())
    ours = {variable.path for variable in weight_decay_exclusions(model)}
    assert ours == {by_timm_name[name].path for name in timm_no_decay}


def test_clipnorm_the_old_name_of_global_clipnorm_still_works_with_a_deprecation_warning(tiny_cait):
    model = tiny_cait()
    with pytest.warns(DeprecationWarning, match=r"adamw\(clipnorm=\.\.\.\) is now global_clipnorm=\.\.\. \(one "
                                                r"norm over all the gradients"):
        optimizer = adamw(model, 1e-3, clipnorm=1.5)
    assert (optimizer.global_clipnorm, optimizer.clipnorm) == (1.5, None)
    with pytest.raises(TypeError, match="clipnorm is the old name of global_clipnorm"):
        adamw(model, 1e-3, clipnorm=1.5, global_clipnorm=1.0)
