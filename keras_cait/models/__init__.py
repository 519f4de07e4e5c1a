"""The CaiT models: the architecture, the variants of the paper, and surgery on a built model.

    architecture   `build_cait` and `CaiTModel` (a classifier that checks its images and carries its
                   class names)
    blocks         the two kinds of block: self-attention (talking heads) and class attention
    precision      which layers stay float32 under a mixed policy (`layer_dtype`)
    inputs         the input shape in either data format and the image check (`check_images`)
    class_names    a classifier's class count and names
    variants       `VARIANTS` (the paper's Table 3), `cait(name)` and the `CaiT_*` constructors
    surgery        `with_new_head`, `set_backbone_trainable`, `at_resolution`, `with_dtype_policy`,
                   `with_drop_path_rate`, `merge_lora`: a model in, a model out, nothing trained
    loader         `load_classifier`: a name, a .keras file or a model as a CaiT classifier, the one
                   door every caller (commands, runs, keras-hub presets) goes through

Example:
    from keras_cait.models import load_classifier, with_new_head

    model = load_classifier("XXS24", classes=5)  # ImageNet's XXS24 with a new 5-class head
    model = with_new_head(load_classifier("best.keras"), classes=3)
"""

from keras_cait.models.architecture import HEAD_NAME, CaiTModel, build_cait, with_class_names
from keras_cait.models.blocks import ClassAttentionBlock, SelfAttentionBlock
from keras_cait.models.class_names import class_count, class_names_of
from keras_cait.models.loader import image_side, is_cait, load_classifier, read_keras_file
from keras_cait.models.precision import float32_if_mixed, has_dtype_policy, layer_dtype
from keras_cait.models.surgery import (
    at_resolution,
    merge_lora,
    pooled_features,
    set_backbone_trainable,
    with_drop_path_rate,
    with_dtype_policy,
    with_new_head,
)
from keras_cait.models.variants import (
    CONSTRUCTORS,
    VARIANTS,
    cait,
    checked_weights,
    default_image_size,
    parse_model_name,
    released_checkpoints,
)

__all__ = [
    "CONSTRUCTORS",
    "HEAD_NAME",
    "VARIANTS",
    "CaiTModel",
    "ClassAttentionBlock",
    "SelfAttentionBlock",
    "at_resolution",
    "build_cait",
    "cait",
    "checked_weights",
    "class_count",
    "class_names_of",
    "default_image_size",
    "float32_if_mixed",
    "has_dtype_policy",
    "image_side",
    "is_cait",
    "layer_dtype",
    "load_classifier",
    "merge_lora",
    "parse_model_name",
    "pooled_features",
    "read_keras_file",
    "released_checkpoints",
    "set_backbone_trainable",
    "with_class_names",
    "with_dtype_policy",
    "with_drop_path_rate",
    "with_new_head",
]
