"""keras_cait.training.augment: what the augmentation builders leave behind."""

import keras_cait.training
from keras_cait.training import augment


def test_random_erasing_stays_the_package_s_function_after_its_module_is_imported():
    augment.random_erasing(0.25)  # imports keras_cait.training.random_erasing, the module

    assert keras_cait.training.random_erasing is augment.random_erasing
