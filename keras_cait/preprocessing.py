"""Image loading, input preprocessing and ImageNet label decoding, as keras.applications offers them."""

import functools
import importlib.resources
import json

import numpy as np

# The mean and std of ImageNet-1k's RGB pixels on a 0..1 scale, as every CaiT checkpoint was
# trained with them (timm's IMAGENET_DEFAULT_MEAN / _STD); the model normalises with them too.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def preprocess_input(x, include_preprocessing=True):
    """Prepares 0..255 RGB images for a CaiT model.

    CaiT models normalise their input themselves by default
    (`include_preprocessing=True`), so then this is the identity, as for
    keras.applications' ConvNeXt and EfficientNet. For a model built with
    `include_preprocessing=False`, pass `include_preprocessing=False` here to get
    `(x / 255 - mean) / std` with the ImageNet mean and std.
    """
    if include_preprocessing:
        return x
    x = np.asarray(x, dtype="float32") / 255.0
    return (x - np.array(IMAGENET_MEAN, "float32")) / np.array(IMAGENET_STD, "float32")


def load_image(path, image_size=224, crop_pct=1.0):
    """Reads an image file as a CaiT is evaluated on it: float32 `(H, W, 3)`, RGB 0..255.

    The reference evaluation transform (timm's for CaiT's checkpoints): the
    image is resized bicubically, keeping its aspect ratio, until it covers
    `image_size / crop_pct`, and the centre `image_size` is cropped. The same
    transform (`keras_cait.images.evaluation_transform`, TensorFlow ops) runs in the
    SavedModel's `serving_bytes` signature and in `keras-cait evaluate`.

    Args:
        path: a JPEG, PNG, GIF, BMP or WebP file (`keras_cait.images.evaluation_transform.
            IMAGE_FILE_FORMATS`; a GIF's first frame is read, an animated WebP is refused).
        image_size: the model's input side, e.g. 224, or its (height, width).
        crop_pct: the fraction of the resized image kept (CaiT: 1.0; DeiT: 0.875).

    Raises FileNotFoundError for a missing file, and ValueError for a folder, a
    file of another format (TIFF, HEIC, JPEG XL, text), one that cannot be
    decoded, or one whose frames hold more than 89,478,485 pixels
    (`keras_cait.images.evaluation_transform.MAX_PIXELS`, checked before decoding; every
    GIF frame counts at its real size). 16-bit PNGs are reduced to 8 bits
    (`keras_cait.images.evaluation_transform.decode_image`).

    Example:
        >>> model = keras_cait.CaiT_S24(weights="imagenet")
        >>> image = keras_cait.preprocessing.load_image("cat.jpg", 224)
        >>> keras_cait.decode_predictions(model.predict(image[None]))
    """
    from keras_cait.images.evaluation_transform import load_image as load

    return load(path, image_size, crop_pct)


@functools.cache
def imagenet_classes():
    """[(wordnet id, class name)] of the 1000 ImageNet-1k classes, in index order (bundled)."""
    text = importlib.resources.files("keras_cait.data").joinpath("imagenet_class_index.json").read_text()
    index = json.loads(text)
    return [tuple(index[str(i)]) for i in range(len(index))]


def decode_predictions(preds, top=5):
    """Decodes a batch of ImageNet predictions into [(wordnet id, name, score)] per image.

    Args:
        preds: array `(batch, 1000)` of probabilities or logits.
        top: how many classes to return per image, best first.
    """
    preds = np.asarray(preds)
    if preds.ndim != 2 or preds.shape[1] != 1000:
        raise ValueError(
            f"decode_predictions expects a batch of ImageNet predictions of shape "
            f"(samples, 1000); got {preds.shape}."
        )
    classes = imagenet_classes()
    results = []
    for row in preds:
        best = np.argsort(row)[::-1][:top]
        results.append([(*classes[i], float(row[i])) for i in best])
    return results
