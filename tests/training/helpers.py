"""Helpers of the source and stream tests."""

import hashlib

import numpy as np

from keras_cait.training import stream

NO_AUGMENTATION = dict(
    scale=(1.0, 1.0), ratio=(1.0, 1.0), horizontal_flip=False, rand_augment_magnitude=0,
    random_erasing=0, mixup_alpha=0, cutmix_alpha=0, label_smoothing=0, repeats=1,
)


def digest(image):
    return hashlib.sha1(np.asarray(image).tobytes()).hexdigest()


def stream_images(source, augmentation, **kwargs):
    batches = stream.training_stream(source, augmentation, **kwargs)
    return [(images.numpy(), labels.numpy()) for images, labels in batches]
