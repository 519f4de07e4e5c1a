"""`CaiTImageClassifierPreprocessor`: what `CaiTImageClassifier` runs on raw images."""

import keras
import keras_hub

from keras_cait.hub import presets
from keras_cait.hub.cait_backbone import CaiTBackbone
from keras_cait.hub.cait_image_converter import CaiTImageConverter


@keras.saving.register_keras_serializable(package="keras_cait")
class CaiTImageClassifierPreprocessor(keras_hub.models.ImageClassifierPreprocessor):
    """Runs `CaiTImageConverter` on `x` and passes `y` and `sample_weight` through.

    `CaiTImageClassifier.fit`, `predict` and `evaluate` call it on every batch,
    inside their tf.data pipeline.

    Example:
        preprocessor = CaiTImageClassifierPreprocessor.from_preset("cait_s24_224")
        x, y = preprocessor(np.random.randint(0, 256, (2, 300, 400, 3)), [1, 0])
    """

    backbone_cls = CaiTBackbone
    image_converter_cls = CaiTImageConverter

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """The preprocessor of a released checkpoint (`"cait_s24_224"`), or of any keras-hub preset."""
        if not presets.is_released(preset):
            return super().from_preset(preset, **kwargs)
        return cls(image_converter=CaiTImageConverter.from_preset(preset), **kwargs)
