"""The public API: the names users import from each public module and the signatures of its
functions and classes, pinned, so that a dropped name or a renamed keyword fails here first.

A renamed keyword keeps its old name for a release (`keras_cait.deprecation.renamed_keywords`),
a moved module its old path (`keras_cait.deprecation.MOVED`); neither shows in a signature.
When a change to the API is meant, refresh `PUBLIC` from the code and review the difference:

    python -m tests.test_public_api > /tmp/public.py
"""

import importlib
import inspect
import pprint
import types

import pytest

# {module: {public name: its signature as inspect.signature writes it, or None (not a function or class)}}.
PUBLIC = {'keras_cait': {'AttentionMaps': '(class_attention: list, class_token_weight: list, self_attention: dict, '
                                 'grid_size: tuple) -> None',
                'CaiT_M24': '(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, '
                            "classes=1000, classifier_activation='softmax', include_preprocessing=True, "
                            'drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_M36': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                            "pooling=None, classes=1000, classifier_activation='softmax', "
                            'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_M48': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                            "pooling=None, classes=1000, classifier_activation='softmax', "
                            'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_S24': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                            "pooling=None, classes=1000, classifier_activation='softmax', "
                            'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_S36': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                            "pooling=None, classes=1000, classifier_activation='softmax', "
                            'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_S48': '(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, '
                            "classes=1000, classifier_activation='softmax', include_preprocessing=True, "
                            'drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_XS24': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                             "pooling=None, classes=1000, classifier_activation='softmax', "
                             'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_XS36': '(include_top=True, weights=None, input_tensor=None, input_shape=None, pooling=None, '
                             "classes=1000, classifier_activation='softmax', include_preprocessing=True, "
                             'drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_XXS24': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                              "pooling=None, classes=1000, classifier_activation='softmax', "
                              'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'CaiT_XXS36': "(include_top=True, weights='imagenet', input_tensor=None, input_shape=None, "
                              "pooling=None, classes=1000, classifier_activation='softmax', "
                              'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                'VARIANTS': None,
                'attention_maps': '(model, images, self_attention_blocks=None, batch_size=32)',
                'decode_predictions': '(preds, top=5, class_names=None)',
                'export_litert': '(model, path, *, quantization=None, overwrite=False)',
                'export_onnx': '(model, path, *, quantization=None, overwrite=False, opset_version=None)',
                'export_openvino': '(model, path, *, quantization=None, calibration=None, calibration_size=300, '
                                   'overwrite=False, verbose=False)',
                'export_saved_model': '(model, path, *, top_k=None, class_names=None, from_logits=None, '
                                      "quantization=None, compute_dtype='float32', jit_compile=False, "
                                      'overwrite=False)',
                'feature_extractor': "(model, indices=None, norm=False, output_format='NLC', name=None)",
                'forward_intermediates': "(model, images, indices=None, norm=False, output_format='NLC', "
                                         'intermediates_only=False)',
                'layers': None,
                'preprocess_input': '(x, include_preprocessing=True)',
                'training': None},
 'keras_cait.export': {'EXPORTERS': None,
                       'FORMATS': None,
                       'Format': '(name: str, suffix: str | None, exporter: str, quantizations: tuple, extra: str '
                                 '| None, refusal: str | None = None, refusals: dict = <factory>, compute_dtypes: '
                                 "tuple = ('float32',), calibrated: tuple = (), modes: dict = <factory>, writes: "
                                 "str = '', runs_on: str = '', quantized_model: str = '', companions: tuple = ()) -> None",
                       'KERAS_QUANTIZATIONS': None,
                       'ONNX_QUANTIZATIONS': None,
                       'QUANTIZATIONS': None,
                       'check_destination': '(path, overwrite=False, quantization=None)',
                       'export_litert': '(model, path, *, quantization=None, overwrite=False)',
                       'export_onnx': '(model, path, *, quantization=None, overwrite=False, opset_version=None)',
                       'export_openvino': '(model, path, *, quantization=None, calibration=None, '
                                          'calibration_size=300, overwrite=False, verbose=False)',
                       'export_saved_model': '(model, path, *, top_k=None, class_names=None, from_logits=None, '
                                             "quantization=None, compute_dtype='float32', jit_compile=False, "
                                             'overwrite=False)',
                       'format_of': '(path)'},
 'keras_cait.hub': {'CaiTBackbone': '(image_shape=(224, 224, 3), embed_dim=384, depth=24, num_heads=8, '
                                    'init_values=1e-05, patch_size=16, mlp_ratio=4.0, class_attention_depth=2, '
                                    'drop_path_rate=0.0, dtype=None, **kwargs)',
                    'CaiTImageClassifier': "(backbone, num_classes, preprocessor=None, pooling='token', "
                                           'activation=None, dropout=0.0, head_dtype=None, **kwargs)',
                    'CaiTImageClassifierPreprocessor': '(image_converter=None, **kwargs)',
                    'CaiTImageConverter': '(image_size=(224, 224), crop_pct=1.0, scale=(0.017124753831663668, '
                                          '0.01750700280112045, 0.017429193899782137), '
                                          'offset=(-2.1179039301310043, -2.0357142857142856, '
                                          '-1.8044444444444445), **kwargs)',
                    'PRESETS': None},
 'keras_cait.layers': {'ClassAttention': '(num_heads, qkv_bias=True, **kwargs)',
                       'ClassToken': '(*args, **kwargs)',
                       'LayerScale': '(init_value=1e-05, **kwargs)',
                       'PatchEmbedding': '(embed_dim, patch_size=16, **kwargs)',
                       'PositionEmbedding': '(grid_size, **kwargs)',
                       'StochasticDepth': '(rate=0.0, seed=None, **kwargs)',
                       'TalkingHeads': '(num_heads, qkv_bias=True, fused_attention=None, **kwargs)',
                       'TalkingHeadsAttention': '(num_heads, qkv_bias=True, fused_attention=None, **kwargs)'},
 'keras_cait.models': {'CONSTRUCTORS': None,
                       'CaiTModel': '(*args, **kwargs)',
                       'ClassAttentionBlock': '(num_heads, mlp_ratio=4.0, init_values=1e-05, drop_path_rate=0.0, '
                                              'qkv_bias=True, **kwargs)',
                       'HEAD_NAME': None,
                       'SelfAttentionBlock': '(num_heads, mlp_ratio=4.0, init_values=1e-05, drop_path_rate=0.0, '
                                             'qkv_bias=True, **kwargs)',
                       'VARIANTS': None,
                       'at_resolution': '(model, image_size)',
                       'build_cait': '(*, embed_dim, depth, num_heads, init_values, patch_size=16, mlp_ratio=4.0, '
                                     'class_attention_depth=2, include_top=True, input_tensor=None, '
                                     'input_shape=(224, 224, 3), pooling=None, classes=1000, '
                                     "classifier_activation='softmax', include_preprocessing=True, "
                                     "drop_path_rate=0.0, name='cait', dtype=None)",
                       'cait': "(variant, include_top=True, weights='imagenet', input_tensor=None, "
                               "input_shape=None, pooling=None, classes=1000, classifier_activation='softmax', "
                               'include_preprocessing=True, drop_path_rate=0.0, name=None, dtype=None)',
                       'checked_weights': '(weights)',
                       'class_count': '(model)',
                       'class_names_of': '(model, wordnet_ids=False)',
                       'default_image_size': '(name)',
                       'float32_if_mixed': '(policy)',
                       'has_dtype_policy': '(model, policy)',
                       'image_side': "(model, argument='model', value=None)",
                       'is_cait': '(model)',
                       'layer_dtype': '(name, policy)',
                       'load_classifier': "(model, *, weights='imagenet', image_size=None, include_top=True, "
                                          "pooling=None, classes=None, classifier_activation='softmax', "
                                          'dtype=None, drop_path_rate=None)',
                       'merge_lora': '(model)',
                       'parse_model_name': "(name, argument='model')",
                       'pooled_features': "(model, argument='model')",
                       'read_keras_file': "(path, argument='model')",
                       'released_checkpoints': '(variant)',
                       'set_backbone_trainable': '(model, trainable)',
                       'with_class_names': '(model, class_names)',
                       'with_drop_path_rate': '(model, rate)',
                       'with_dtype_policy': '(model, policy)',
                       'with_new_head': "(model, classes, classifier_activation='softmax', name=None, "
                                        'class_names=None)'},
 'keras_cait.preprocessing': {'IMAGENET_MEAN': None,
                              'IMAGENET_STD': None,
                              'decode_predictions': '(preds, top=5, class_names=None)',
                              'imagenet_classes': '()',
                              'load_image': '(path, image_size=224, crop_pct=1.0)',
                              'preprocess_input': '(x, include_preprocessing=True)'},
 'keras_cait.training': {'Augmentation': '(image_size: int, num_classes: int, scale: tuple = (0.08, 1.0), ratio: '
                                         'tuple = (0.75, 1.3333333333333333), horizontal_flip: bool = True, '
                                         'rand_augment_magnitude: float = 9.0, random_erasing: float = 0.25, '
                                         'mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, switch_prob: float '
                                         '= 0.5, label_smoothing: float = 0.1, repeats: int = 3) -> None',
                         'Distiller': "(student, teacher, distillation_type='hard', alpha=0.5, tau=1.0, "
                                      'teacher_preprocessing=None, student_from_logits=False, '
                                      'teacher_from_logits=False, **kwargs)',
                         'EpochCosine': '(peak, epochs, steps_per_epoch, warmup_epochs=5.0, warmup_start=1e-06, '
                                        'minimum=1e-05)',
                         'MixupCutmix': '(num_classes, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, '
                                        'label_smoothing=0.1, seed=None, **kwargs)',
                         'RECIPES': None,
                         'RandAugment': '(*args, **kwargs)',
                         'RandomResizedCrop': '(height, width, scale=(0.08, 1.0), ratio=(0.75, '
                                              "1.3333333333333333), interpolation='bicubic', antialias=True, "
                                              'seed=None, data_format=None, **kwargs)',
                         'Recipe': '(batch_size: int = 64, lr: float = 0.0005, lr_batch: int = 512, weight_decay: '
                                   'float = 0.05, opt_betas: tuple = (0.9, 0.999), opt_eps: float = 1e-08, '
                                   'clip_grad: float = None, epochs: int = 400, warmup_epochs: float = 5.0, '
                                   "warmup_lr: float = 1e-06, min_lr: float = 1e-05, sched: str = 'epoch', "
                                   'head_epochs: int = 0, head_lr: float = 0.001, keep_head: bool = False, '
                                   'randaugment: float = 9.0, reprob: float = 0.25, mixup: float = 0.8, cutmix: '
                                   'float = 1.0, mixup_switch_prob: float = 0.5, repeated_aug: int = 3, '
                                   'smoothing: float = 0.1, drop_path: float = 0.1, model_ema: bool = True, '
                                   "model_ema_decay: float = 0.99996, distillation_type: str = 'none', "
                                   'distillation_alpha: float = 0.5, distillation_tau: float = 1.0) -> None',
                         'adamw': '(model, learning_rate, weight_decay=0.05, beta_1=0.9, beta_2=0.999, '
                                  'epsilon=1e-08, global_clipnorm=None, use_ema=False, ema_momentum=0.99996)',
                         'at_resolution': '(model, image_size)',
                         'augment': None,
                         'distillation': None,
                         'distribute': None,
                         'enable_lora': "(model, rank, targets=('qkv', 'query', 'key', 'value', "
                                        "'output_projection'), alpha=None)",
                         'image_checks': None,
                         'lora': None,
                         'merge_lora': '(model)',
                         'rand_augment': '(magnitude=9, num_ops=2, seed=None)',
                         'random_erasing': '(probability=0.25)',
                         'recipe': None,
                         'resume': None,
                         'run': None,
                         'scaled_learning_rate': '(global_batch_size, base=0.0005, reference_batch_size=512)',
                         'schedule': None,
                         'set_backbone_trainable': '(model, trainable)',
                         'sources': None,
                         'stream': None,
                         'transfer': None,
                         'warmup_cosine': '(peak, total_steps, warmup_steps, warmup_start=1e-06, minimum=1e-05)',
                         'weight_decay_exclusions': '(model)',
                         'with_dtype_policy': '(model, policy)',
                         'with_new_head': "(model, classes, classifier_activation='softmax', name=None, "
                                          'class_names=None)'}}

# Names a module loads on first use (module `__getattr__`), beyond its `__all__`.
LAZY = {
    "keras_cait": lambda module: ["training", *importlib.import_module("keras_cait.export").EXPORTERS],
    "keras_cait.training": lambda module: list(module._READ_WHEN_FIRST_USED),
}


def public_names(name):
    """The module's `__all__` (and what it loads on first use), else every name it defines
    itself without a leading underscore."""
    module = importlib.import_module(name)
    if hasattr(module, "__all__"):
        names = [*module.__all__, *LAZY.get(name, lambda _: [])(module)]
    else:
        names = [attribute for attribute, value in vars(module).items() if not attribute.startswith("_")
                 and not isinstance(value, types.ModuleType) and getattr(value, "__module__", name) == name]
    return sorted(set(names))


def signature(value):
    if isinstance(value, types.ModuleType) or not callable(value):
        return None
    try:
        return str(inspect.signature(value))
    except (TypeError, ValueError):  # a builtin without one
        return None


def current(name):
    module = importlib.import_module(name)
    return {attribute: signature(getattr(module, attribute)) for attribute in public_names(name)}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_is_there_and_no_other(name):
    module, names = importlib.import_module(name), public_names(name)
    dropped = sorted(attribute for attribute in PUBLIC[name]
                     if attribute not in names or not hasattr(module, attribute))
    added = sorted(set(names) - set(PUBLIC[name]))
    assert (dropped, added) == ([], []), (
        f"{name}: names dropped {dropped}, added {added}; a dropped name keeps working with a "
        "DeprecationWarning for a release; refresh PUBLIC (this file's docstring) for a new one")


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_signature_is_as_pinned(name):
    module = importlib.import_module(name)
    changed = {attribute: (expected, signature(getattr(module, attribute)))
               for attribute, expected in PUBLIC[name].items()
               if hasattr(module, attribute) and signature(getattr(module, attribute)) != expected}
    assert changed == {}, (
        f"{name}: signatures changed (pinned, now): {changed}; a renamed keyword keeps its old name "
        "(keras_cait.deprecation.renamed_keywords); refresh PUBLIC for a new keyword")


if __name__ == "__main__":
    MODULES = ["keras_cait", "keras_cait.layers", "keras_cait.preprocessing", "keras_cait.models",
               "keras_cait.training", "keras_cait.export", "keras_cait.hub"]
    print("PUBLIC = " + pprint.pformat({name: current(name) for name in MODULES}, width=115, sort_dicts=True))
