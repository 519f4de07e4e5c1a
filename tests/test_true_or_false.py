"""Every True/False argument of the library from Python takes True or False (numpy's too) and refuses
anything else by name: a str 'no' or 'False' from a config file is truthy, so taking it would do the
opposite of what was meant (build a head asked to be left out, load weights asked to be skipped)."""

import numpy as np
import pytest

from keras_cait.errors import ArgumentError, checked_bool


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False), 0, 1, np.int64(1)])
def test_true_and_false_are_taken_as_python_bools(value):
    taken = checked_bool("norm", value)
    assert type(taken) is bool and taken == bool(value)


@pytest.mark.parametrize("value", ["no", "False", "yes", 2, -1, None, 1.0])
def test_anything_else_is_refused_by_the_argument_s_name(value):
    with pytest.raises(ArgumentError) as refused:
        checked_bool("include_top", value, "True (with the head) or False")
    assert (refused.value.argument, refused.value.value, refused.value.usage) == ("include_top", value, True)
    assert str(refused.value) == (f"include_top={value!r}: must be True (with the head) or False, "
                                  f"not {type(value).__name__}")


def _callers(tiny_cait):
    """(argument, a call given that argument's value): each public function with a True/False argument."""
    from keras_cait import preprocess_input
    from keras_cait.hub import CaiTBackbone
    from keras_cait.inspection import feature_extractor
    from keras_cait.models import load_classifier
    from keras_cait.models.architecture import build_cait
    from keras_cait.models.surgery import set_backbone_trainable
    from keras_cait.training import adamw
    from tests.conftest import TINY_CAIT, TINY_SIZE

    shape = (TINY_SIZE, TINY_SIZE, 3)
    return [
        ("include_top", lambda value: load_classifier("XXS24", weights=None, image_size=32, include_top=value)),
        ("include_top", lambda value: build_cait(**TINY_CAIT, input_shape=shape, include_top=value)),
        ("include_preprocessing", lambda value: build_cait(**TINY_CAIT, input_shape=shape,
                                                           include_preprocessing=value)),
        ("norm", lambda value: feature_extractor(tiny_cait(include_top=False), norm=value)),
        ("load_weights", lambda value: CaiTBackbone.from_preset("cait_xxs24_224", load_weights=value)),
        ("include_preprocessing", lambda value: preprocess_input(np.zeros((1, 2, 2, 3)), include_preprocessing=value)),
        ("use_ema", lambda value: adamw(tiny_cait(), 1e-3, use_ema=value)),
        ("trainable", lambda value: set_backbone_trainable(tiny_cait(), value)),
    ]


@pytest.mark.parametrize("index", range(8))
@pytest.mark.parametrize("value", ["no", "False"])
def test_each_true_or_false_argument_refuses_a_str(tiny_cait, no_network, keras_cache, index, value):
    argument, call = _callers(tiny_cait)[index]
    with pytest.raises(ArgumentError) as refused:
        call(value)
    assert (refused.value.argument, refused.value.value) == (argument, value)
    assert str(refused.value).startswith(f"{argument}={value!r}: must be True ")
    call(np.bool_(False))  # numpy's False is taken
