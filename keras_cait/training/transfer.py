"""Transfer learning's model surgery (a new head, freezing the backbone, another resolution or
dtype policy), which lives with the models: `keras_cait.models.surgery`. Its names are
`keras_cait.training`'s too (`keras_cait.training.with_new_head`) and this module's."""

from keras_cait.models.surgery import (  # noqa: F401
    HEAD_NAME,
    at_resolution,
    set_backbone_trainable,
    with_dtype_policy,
    with_new_head,
)
