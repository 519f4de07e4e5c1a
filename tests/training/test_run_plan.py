"""`keras_cait.training.run_plan`: how a run compiles a model (loss scaling, its metrics) and its top-k rule."""

import keras
import numpy as np
import pytest

from keras_cait.models.architecture import build_cait
from keras_cait.training import RECIPES, run_plan
from keras_cait.training.distillation import Distiller
from tests.conftest import TINY_CAIT, TINY_SIZE


def tiny(classes=3, dtype=None):
    return build_cait(**TINY_CAIT, input_shape=(TINY_SIZE, TINY_SIZE, 3), classes=classes, dtype=dtype)


@pytest.mark.parametrize("dtype, scaled", [("mixed_float16", True), ("mixed_bfloat16", False), ("float32", False)])
def test_a_model_computing_in_float16_gets_loss_scaling_under_any_global_policy(dtype, scaled, policy):
    """Keras wraps the optimizer by the model's own policy, which a run no longer sets globally: a
    model built with dtype="mixed_float16" under the float32 global policy would train unscaled."""
    policy("float32")
    for model in (tiny(dtype=dtype), Distiller(tiny(dtype=dtype), tiny(dtype="float32"))):
        run_plan.compile_for(model, RECIPES["transfer"], 8, 10)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == scaled, type(model).__name__
    policy("mixed_float16")  # built under the global policy, as before: scaled once, not twice
    model = tiny()
    run_plan.compile_for(model, RECIPES["transfer"], 8, 10)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert not isinstance(model.optimizer.inner_optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.parametrize("classes, top5", [(5, False), (6, True)])
def test_top5_is_reported_above_5_classes_in_training_and_evaluation(classes, top5):
    """Of 5 classes every label is in the top 5: top-5 accuracy would always be 100 %."""
    assert run_plan.reports_top5(classes) == top5
    model = tiny(classes)
    run_plan.compile_for(model, RECIPES["transfer"], 8, 10, jit_compile=False)
    logs = model.evaluate(np.zeros((2, TINY_SIZE, TINY_SIZE, 3)), np.eye(classes)[:2], return_dict=True, verbose=0)
    assert ("top5" in logs) == top5, logs
