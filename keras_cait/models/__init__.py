"""The CaiT models: the architecture, the variants of the paper, and surgery on a built model.

    architecture   the two kinds of block, `build_cait`, `CaiTModel` (a classifier that checks its
                   images and carries its class names) and the dtype rule of mixed precision
    variants       `VARIANTS` (the paper's Table 3), `cait(name)` and the `CaiT_*` constructors
    surgery        `with_new_head`, `set_backbone_trainable`, `at_resolution`, `with_dtype_policy`,
                   `merge_lora`: a model in, a model out, nothing trained

Example:
    from keras_cait.models import cait, with_new_head

    model = with_new_head(cait("XXS24", include_top=False, pooling="token"), classes=5)
"""

from keras_cait.models.architecture import (
    CaiTModel,
    ClassAttentionBlock,
    SelfAttentionBlock,
    build_cait,
    class_count,
    class_names_of,
    float32_if_mixed,
    has_dtype_policy,
    layer_dtype,
    with_class_names,
)
from keras_cait.models.surgery import (
    HEAD_NAME,
    at_resolution,
    merge_lora,
    set_backbone_trainable,
    with_dtype_policy,
    with_new_head,
)
from keras_cait.models.variants import (
    CONSTRUCTORS,
    VARIANTS,
    cait,
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
    "class_count",
    "class_names_of",
    "default_image_size",
    "float32_if_mixed",
    "has_dtype_policy",
    "layer_dtype",
    "merge_lora",
    "parse_model_name",
    "released_checkpoints",
    "set_backbone_trainable",
    "with_class_names",
    "with_dtype_policy",
    "with_new_head",
]
