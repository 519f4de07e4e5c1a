"""Image loading, input preprocessing and label decoding (ImageNet's or a fine-tuned model's), as
keras.applications offers them."""

import collections.abc
import functools
import importlib.resources
import json

import numpy as np

from keras_cait.errors import ArgumentError, check_names_not_mapping, checked_bool, checked_count

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
    `(x / 255 - mean) / std` with the ImageNet mean and std, float32: a numpy array for an
    array or a list, a tensor of the Keras backend for a tensor (inside `tf.data.Dataset.map`
    too, on TensorFlow), as keras.applications' `preprocess_input` returns them.
    """
    normalised_by_model = checked_bool("include_preprocessing", include_preprocessing,
                                       "True (the model normalises its input itself) or False (normalised here)")
    if x is None or isinstance(x, (str, bytes)):  # a file's path too: it was returned, as images, by the identity
        raise ArgumentError("x", x, "must be images, 0..255 RGB (an array or a tensor), not "
                            f"{type(x).__name__}", "e.g. load_image(path, 224)[None]", usage=True)
    if normalised_by_model:
        return x
    if isinstance(x, (np.ndarray, np.generic, list, tuple, int, float)):
        x = np.asarray(x, dtype="float32")
    shape = tuple(x.shape)
    if not shape or shape[-1] not in (3, None):  # else numpy's "operands could not be broadcast together"
        raise ArgumentError("x", x, f"is of shape {shape}, not RGB images: their last axis holds 3 channels",
                            "give (..., height, width, 3) images, 0..255 RGB", usage=True,
                            shown=f"<{type(x).__name__} of shape {shape}>")
    if isinstance(x, np.ndarray):
        x = x / 255.0
        return (x - np.array(IMAGENET_MEAN, "float32")) / np.array(IMAGENET_STD, "float32")
    import keras  # a tensor, symbolic too: np.asarray cannot read one inside a traced function

    x = keras.ops.cast(x, "float32") / 255.0
    return (x - keras.ops.array(IMAGENET_MEAN, "float32")) / keras.ops.array(IMAGENET_STD, "float32")


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


def decode_predictions(preds, top=5, class_names=None):
    """Decodes a batch of predictions into `[(class id, class name, score)]` per image, best first,
    as keras.applications' `decode_predictions`: ImageNet's 1000 classes by default (the id a
    WordNet id), or with `class_names` a fine-tuned model's own (the id the class's index in the
    model's output).

    Args:
        preds: array `(samples, classes)` of probabilities or logits.
        top: how many classes to return per image, best first (all of them where there are fewer).
        class_names: the names of the model's classes in index order, e.g. `model.class_names` of
            a model fine-tuned on a folder (the names of its subfolders); None: ImageNet's.

    Example:
        >>> model = keras.models.load_model("runs/flowers/best.keras")
        >>> image = keras_cait.preprocessing.load_image("rose.jpg", model.input_shape[1])
        >>> keras_cait.decode_predictions(model.predict(image[None]), top=2, class_names=model.class_names)
        [[(1, 'roses', 0.97), (0, 'daisy', 0.03)]]
    """
    checked_count("top", top, 5)
    given = preds
    preds = np.asarray(list(preds) if isinstance(preds, collections.abc.Iterator) else preds)
    if preds.dtype.kind not in "biuf":  # a str or None was "got ()", which never said what preds was
        raise ArgumentError("preds", given, f"must be class scores, numbers of shape (samples, classes), not "
                            f"{type(given).__name__}" + (f" of {preds.dtype}" if preds.ndim else ""),
                            "e.g. decode_predictions(model.predict(images))", usage=True,
                            shown=None if given is None or isinstance(given, (str, bytes)) else f"<{type(given).__name__}>")
    if class_names is None:
        if preds.ndim != 2 or preds.shape[1] != 1000:
            raise ArgumentError(
                "preds", preds, "must be ImageNet's class scores, of shape (samples, 1000)", "a fine-tuned model's predictions decode with "
                "its own class names: decode_predictions(preds, class_names=model.class_names)",
                shown=f"<array of shape {preds.shape}>")
        classes = imagenet_classes()
    else:
        check_names_not_mapping("class_names", class_names)
        if isinstance(class_names, collections.abc.Iterator):
            class_names = list(class_names)
        if isinstance(class_names, str) or not all(isinstance(name, str) for name in class_names):
            raise ArgumentError("class_names", class_names, "must be a list of str",
                                "give the model's class names in index order, e.g. model.class_names", usage=True)
        if preds.ndim != 2:
            raise ArgumentError("preds", preds, "must be a batch of predictions of shape (samples, classes)",
                                "e.g. model.predict(images)", shown=f"<array of shape {preds.shape}>")
        if len(class_names) != preds.shape[1]:
            raise ArgumentError(
                "class_names", class_names, f"{len(class_names)} names for predictions of {preds.shape[1]} classes",
                "give one name per class, in the order of the model's outputs (model.class_names)",
                shown=None if len(class_names) <= 6 else f"[{len(class_names)} names]")
        classes = list(enumerate(class_names))
    results = []
    for row in preds:
        best = np.argsort(-row, kind="stable")[:top]
        results.append([(*classes[i], float(row[i])) for i in best])
    return results
