"""keras-hub's own test harness on CaiT: the `TestCase` of the installed keras-hub, run as keras-hub
runs it on its models (`keras_hub/src/models/vit/*_test.py`), not a copy of it.

One check stays off: `run_precision_test` (the mixed-precision step of
`run_vision_backbone_test`) asserts that every sublayer computes in the policy's half dtype and
that the output is half. CaiT keeps timm's float32 residual stream under a mixed policy (LayerNorms,
LayerScale, the position embedding and class token, the residual adds: what torch.autocast keeps in
float32), so both are float32 by design; `test_mixed_policies_keep_timm_s_float32_stream`
(test_dtypes_and_quantized_presets.py) checks what holds instead. The channels_first step, which
keras-hub itself leaves out on TensorFlow's CPU, is turned off too, for the reason given there.

`run_litert_export_test` is not called: keras-hub 0.32 runs it on the PyTorch backend with
litert-torch only and skips it on TensorFlow (`self.skipTest`), which is this package's backend;
the LiteRT export of a CaiT is tested by tests/export/test_onnx_litert.py.
"""

import os

import keras_hub
import numpy as np
import pytest

from keras_cait.hub import (
    CaiTBackbone,
    CaiTImageClassifier,
    CaiTImageClassifierPreprocessor,
    CaiTImageConverter,
)
from keras_cait.preprocessing import IMAGENET_MEAN, IMAGENET_STD
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.hub.keras_hub_test_case import TestCase
from tests.weights.fake_hf_hub import hf, hub  # noqa: F401  (fixtures)

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
            # keras-hub runs its channels_first check only on a GPU or another backend (never on
            # TensorFlow's CPU), and there it would expect the output transposed like an image,
            # (batch, channels, tokens); a CaiT gives (batch, tokens, channels) in every data format.
            run_data_format_check=False,
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
        self.init_kwargs = self.init_kwargs_of()

    @staticmethod
    def init_kwargs_of():
        converter = CaiTImageConverter(image_size=(TINY_SIZE, TINY_SIZE))
        return dict(
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

    @pytest.mark.large
    def test_saved_preset_folder(self):
        classifier = CaiTImageClassifier(**self.init_kwargs)
        folder = os.path.join(self.get_temp_dir(), "preset")
        classifier.save_to_preset(folder)
        self.run_preset_test(
            cls=keras_hub.models.ImageClassifier,
            preset=folder,
            input_data=normalised_images(),
            expected_output=classifier(normalised_images()),
        )


class CaiTPresetTest(TestCase):
    """`run_preset_test` on a released preset, served by the fake hub (a random timm checkpoint)."""

    @pytest.fixture(autouse=True)
    def released_checkpoint(self, hf, hub, timm_checkpoint, timm_reference, keras_cache, monkeypatch):
        from keras_cait.weights import CHECKPOINTS

        monkeypatch.setitem(CHECKPOINTS["cait_xxs24_224"], "sha256", None)  # verified by the hub's hash
        reference, body = timm_checkpoint("cait_xxs24_224")
        hub.serve("cait_xxs24_224", body)
        uint8 = timm_reference.images(2, 224)
        self.logits, _ = timm_reference.outputs(reference, uint8)
        self.images = ((uint8 / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).astype("float32")

    @pytest.mark.large
    def test_released_classifier_preset(self):
        self.run_preset_test(
            cls=CaiTImageClassifier,
            preset="cait_xxs24_224",
            input_data=self.images,
            expected_output_shape=(2, 1000),
            expected_partial_output=self.logits[0],  # timm's logits (atol 0.01)
        )

    @pytest.mark.large
    def test_released_backbone_preset(self):
        self.run_preset_test(
            cls=CaiTBackbone,
            preset="cait_xxs24_224",
            input_data=self.images,
            expected_output_shape=(2, 197, 192),
        )
