"""CaiT in keras-hub's preset API: `from_preset`, `fit`, `save_to_preset`, `upload_preset`.

Needs the optional extra: `pip install "keras-cait[hub]"` (installs keras-hub).
`import keras_cait` does not load this module; `import keras_cait.hub` does, and
registers the classes with Keras, so that `keras_hub.models.ImageClassifier
.from_preset(folder)` can rebuild a saved CaiT.

    import keras_cait.hub
    classifier = keras_cait.hub.CaiTImageClassifier.from_preset("cait_s24_224")
    classifier.predict(images)   # 0..255 RGB of any size: resized and cropped as timm evaluates

The ten released checkpoints are presets named as timm names them
(`keras_cait.hub.PRESETS`); their weights come as `weights="imagenet"` fetches them.
"""

try:
    import keras_hub  # noqa: F401
except ImportError as error:
    raise ImportError(
        f"keras_cait.hub needs keras-hub ({error}). Install it with: pip install \"keras-cait[hub]\""
    ) from error

from keras_cait.hub.cait_backbone import CaiTBackbone
from keras_cait.hub.cait_image_classifier import CaiTImageClassifier
from keras_cait.hub.cait_image_classifier_preprocessor import CaiTImageClassifierPreprocessor
from keras_cait.hub.cait_image_converter import CaiTImageConverter
from keras_cait.hub.presets import PRESETS

__all__ = [
    "PRESETS",
    "CaiTBackbone",
    "CaiTImageClassifier",
    "CaiTImageClassifierPreprocessor",
    "CaiTImageConverter",
]
