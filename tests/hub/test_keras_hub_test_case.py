"""keras-hub's own test harness on CaiT: the `TestCase` of the installed keras-hub, run as keras-hub
runs it on its models (`keras_hub/src/models/vit/*_test.py`), not a copy of it.

One check stays off: `run_precision_test` (the mixed-precision step of
`run_vision_backbone_test`) asserts that every sublayer computes in the policy's half dtype and
that the output is half. CaiT keeps timm's float32 residual stream under a mixed policy (LayerNorms,
LayerScale, the position embedding and class token, the residual adds: what torch.autocast keeps in
float32), so both are float32 by design; `test_mixed_policies_keep_timm_s_float32_stream` checks
what holds instead.
"""

import keras
import numpy as np
import pytest

from keras_cait.hub import (
    CaiTBackbone,
    CaiTImageClassifier,
    CaiTImageClassifierPreprocessor,
    CaiTImageConverter,
)
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.hub.keras_hub_test_case import TestCase

BACKBONE_KWARGS = dict(image_shape=(TINY_SIZE, TINY_SIZE, 3), **TINY_CAIT)
TOKENS = 1 + (TINY_SIZE // 16) ** 2


def normalised_images(batch=2, seed=0):
    return np.random.default_rng(seed).normal(size=(batch, TINY_SIZE, TINY_SIZE, 3)).astype("float32")


class CaiTBackboneTest(TestCase):
    def setUp(self):
        self.init_kwargs = dict(BACKBONE_KWARGS)
        self.input_data = normalised_images()

    @pytest.mark.large
    def test_backbone_basics(self):
        self.run_vision_backbone_test(
            cls=CaiTBackbone,
            init_kwargs=self.init_kwargs,
            input_data=self.input_data,
            expected_output_shape=(2, TOKENS, TINY_CAIT["embed_dim"]),
            # timm's float32 residual stream under mixed precision (see the module docstring).
            run_mixed_precision_check=False,
        )

    @pytest.mark.large
    def test_saved_model(self):
        self.run_model_saving_test(
            cls=CaiTBackbone, init_kwargs=self.init_kwargs, input_data=self.input_data
        )


class CaiTImageClassifierTest(TestCase):
    def setUp(self):
        self.images = np.random.default_rng(1).integers(0, 256, (2, 40, 48, 3)).astype("float32")
        self.labels = [0, 1]
        converter = CaiTImageConverter(image_size=(TINY_SIZE, TINY_SIZE))
        self.init_kwargs = dict(
            backbone=CaiTBackbone(**BACKBONE_KWARGS),
            num_classes=2,
            preprocessor=CaiTImageClassifierPreprocessor(converter),
        )

    @pytest.mark.large
    def test_classifier_basics(self):
        self.run_task_test(
            cls=CaiTImageClassifier,
            init_kwargs=self.init_kwargs,
            train_data=(self.images, self.labels),
            expected_output_shape=(2, 2),
        )

    @pytest.mark.large
    def test_saved_model(self):
        self.run_model_saving_test(
            cls=CaiTImageClassifier,
            init_kwargs=self.init_kwargs,
            input_data=normalised_images(),
        )
