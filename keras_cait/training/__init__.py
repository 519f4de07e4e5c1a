"""Training CaiT with Keras: the DeiT/CaiT recipe as building blocks (Keras core only).

The runs that put them together are `keras_cait.training.run` (`train`, `finetune`,
`evaluate`: stages, resume, the run record, class names), which `keras-cait train |
finetune | evaluate` call; it reads data with tf.data, so it is imported on its own:
`from keras_cait.training import run`.

    recipe.Recipe, RECIPES    every knob of a run in one object; the named recipes (deit, deit-highres, transfer,
                              scratch; demo its former name)
    optimizer.adamw           AdamW, weight decay 0.05 off biases/norms/LayerScale/pos_embed/cls_token
    schedule.EpochCosine      timm's CosineLRScheduler per epoch; scaled_learning_rate: 5e-4 × batch / 512
    schedule.warmup_cosine    a per-step warmup + cosine for short runs
    Distiller                 DeiT's hard/soft distillation from any frozen Keras teacher, in model.fit
    RandomResizedCrop         Inception crop (Keras preprocessing layer)
    RandAugment               Keras' RandAugment computing only the ops it applies
    MixupCutmix               mixup/cutmix switch, one λ per batch, soft smoothed labels
    augment.Augmentation      the whole per-image and per-batch augmentation with DeiT's defaults
    sources                   tf.data sources: image folders, TFRecords, TFDS
    image_checks              the images of a source that cannot be decoded, found before a run and named after
    stream                    resumable training batches and evaluation batches
    transfer                  new heads, freezing, another resolution or dtype (keras_cait.models.surgery's)
    lora                      LoRA fine-tuning (enable_lora); merge_lora is keras_cait.models.surgery's
    resume                    step-exact backups and a resuming fit
    distribute                MirroredStrategy / MultiWorkerMirroredStrategy / DataParallel
"""

import importlib

from keras_cait.training import augment, distillation, distribute, lora, recipe, resume, schedule, transfer
from keras_cait.training.augment import Augmentation, rand_augment, random_erasing
from keras_cait.training.distillation import Distiller
from keras_cait.training.lora import enable_lora, merge_lora
from keras_cait.training.mixup_cutmix import MixupCutmix
from keras_cait.training.optimizer import adamw, weight_decay_exclusions
from keras_cait.training.rand_augment import RandAugment
from keras_cait.training.recipe import RECIPES, Recipe
from keras_cait.training.random_resized_crop import RandomResizedCrop
from keras_cait.training.schedule import EpochCosine, scaled_learning_rate, warmup_cosine
from keras_cait.training.transfer import at_resolution, set_backbone_trainable, with_dtype_policy, with_new_head

__all__ = [
    "RECIPES",
    "Recipe",
    "Augmentation",
    "Distiller",
    "EpochCosine",
    "MixupCutmix",
    "RandAugment",
    "RandomResizedCrop",
    "adamw",
    "at_resolution",
    "augment",
    "distillation",
    "distribute",
    "enable_lora",
    "lora",
    "merge_lora",
    "rand_augment",
    "recipe",
    "random_erasing",
    "resume",
    "scaled_learning_rate",
    "schedule",
    "set_backbone_trainable",
    "transfer",
    "warmup_cosine",
    "weight_decay_exclusions",
    "with_dtype_policy",
    "with_new_head",
]


# What reads data with tf.data: imported when first read (`training.run.finetune(...)`,
# `training.sources.image_folder(...)`), not with the pieces above, which a `model.fit` of one's
# own uses without them.
_READ_WHEN_FIRST_USED = ("run", "sources", "stream", "image_checks")


def __getattr__(name):
    if name in _READ_WHEN_FIRST_USED:
        return importlib.import_module(f"keras_cait.training.{name}")
    raise AttributeError(f"module 'keras_cait.training' has no attribute {name!r}")
