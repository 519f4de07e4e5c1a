"""DeiT/CaiT's learning rate: linear scaling with the batch, linear warmup, cosine decay.

    EpochCosine      timm's CosineLRScheduler, one rate per epoch (the recipe's)
    warmup_cosine    a per-step variant for short runs (Keras' CosineDecay)
"""

import math

import keras
from keras import ops

from keras_cait.errors import ArgumentError, Named
from keras_cait.training.knobs import DEIT

# The defaults are DeiT's recipe (keras_cait.training.knobs holds its values).
BASE_LEARNING_RATE = DEIT.lr
REFERENCE_BATCH_SIZE = DEIT.lr_batch
WARMUP_LEARNING_RATE = DEIT.warmup_lr
MIN_LEARNING_RATE = DEIT.min_lr
WARMUP_EPOCHS = DEIT.warmup_epochs


_EXAMPLES = dict(global_batch_size=512, base=5e-4, reference_batch_size=512, peak=1e-3, total_steps=1000,
                 warmup_steps=50, warmup_start=1e-6, minimum=1e-5, epochs=300, steps_per_epoch=2502, warmup_epochs=5)


def _check_numbers(**values):
    """An `ArgumentError` naming the first of `values` that is no number (a str read from a config
    file, None, a bool); the ranges are each function's own checks (`_out_of_range`)."""
    for name, value in values.items():
        if isinstance(value, bool) or not hasattr(value, "__float__"):
            raise ArgumentError(name, value, f"must be a number, not {type(value).__name__}",
                                ["e.g. ", Named(name, _EXAMPLES[name])], usage=True)


def _out_of_range(name, value, bounds, example=None):
    """The `ArgumentError` of `name=value` outside `bounds` (a str, or a list with `Named` parts);
    `example`: a value that fits (default: the recipe's)."""
    return ArgumentError(name, value, ["must be ", *([bounds] if isinstance(bounds, str) else bounds)],
                         ["e.g. ", Named(name, _EXAMPLES[name] if example is None else example)], usage=True)


def _check_count(name, value):
    """A positive whole number (`3.0` too: a config's float), else `_out_of_range`."""
    if not (value > 0 and float(value).is_integer()):
        raise _out_of_range(name, value, "a positive whole number")


def _check_rates(peak, warmup_start, minimum):
    """Finite rates of at least 0, `minimum` at most `peak`."""
    if not 0 <= peak < math.inf:
        raise _out_of_range("peak", peak, "a finite rate of at least 0")
    if not 0 <= warmup_start < math.inf:
        raise _out_of_range("warmup_start", warmup_start, "a finite rate of at least 0")
    if not 0 <= minimum <= peak:
        raise _out_of_range("minimum", minimum, ["at least 0 and at most ", Named("peak", peak)], 0.0)


def scaled_learning_rate(
    global_batch_size, base=BASE_LEARNING_RATE, reference_batch_size=REFERENCE_BATCH_SIZE
):
    """DeiT's linear scaling rule: `base × global_batch_size / 512`.

    `global_batch_size` is the batch summed over all replicas and workers, so
    adding GPUs at a fixed per-GPU batch raises the rate with them; `base` is
    the rate for a batch of `reference_batch_size`.

    >>> scaled_learning_rate(1024)
    0.001
    """
    _check_numbers(global_batch_size=global_batch_size, base=base, reference_batch_size=reference_batch_size)
    _check_count("global_batch_size", global_batch_size)
    _check_count("reference_batch_size", reference_batch_size)
    return base * global_batch_size / reference_batch_size


def warmup_cosine(
    peak,
    total_steps,
    warmup_steps,
    warmup_start=WARMUP_LEARNING_RATE,
    minimum=MIN_LEARNING_RATE,
):
    """Linear warmup from `warmup_start` to `peak`, then cosine decay to `minimum`.

        lr(t) = warmup_start + (peak - warmup_start) t / W                  t < W
        lr(t) = minimum + (peak - minimum) (1 + cos(π (t - W) / (T - W))) / 2   t >= W

    with W = `warmup_steps`, T = `total_steps`; after T it stays at `minimum`.
    It is Keras core's `CosineDecay` with `warmup_target`. It differs from
    DeiT's schedule (`EpochCosine`, timm's CosineLRScheduler), which moves once
    per epoch and lays the warmup over the cosine instead of before it; use it
    for short runs (a few epochs) where one rate per epoch is too coarse.

    Args:
        peak: the rate reached after warmup, e.g. `scaled_learning_rate(batch)`.
        total_steps: steps of the whole run (epochs × steps per epoch).
        warmup_steps: steps of the warmup (DeiT: 5 epochs).
        warmup_start: the rate of the first step (DeiT: 1e-6).
        minimum: the final rate (DeiT: 1e-5).
    """
    _check_numbers(peak=peak, total_steps=total_steps, warmup_steps=warmup_steps, warmup_start=warmup_start,
                   minimum=minimum)
    _check_count("total_steps", total_steps)
    if not 0 <= warmup_steps < total_steps:
        raise _out_of_range("warmup_steps", warmup_steps, ["at least 0 and shorter than the run of ",
                                                           Named("total_steps", total_steps)], total_steps // 20)
    _check_rates(peak, warmup_start, minimum)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=warmup_start if warmup_steps else peak,
        decay_steps=total_steps - warmup_steps,
        alpha=minimum / peak if peak else 0.0,
        warmup_target=peak if warmup_steps else None,
        warmup_steps=warmup_steps,
    )


@keras.saving.register_keras_serializable(package="keras_cait")
class EpochCosine(keras.optimizers.schedules.LearningRateSchedule):
    """timm's `CosineLRScheduler` as DeiT/CaiT train with it: one rate per epoch.

    For epoch e = ⌊step / steps_per_epoch⌋ of a run of T epochs, W of warmup:

        lr(e) = warmup_start + (peak - warmup_start) e / W                e < W
        lr(e) = minimum + (peak - minimum) (1 + cos(π e / T)) / 2          W <= e < T
        lr(e) = minimum                                                   e >= T

    The warmup is overlaid on the cosine (timm's `warmup_prefix=False`): the
    cosine is over all T epochs, not the T - W after the warmup. Epoch e gets
    `scheduler._get_lr(e)`, as timm's train.py steps it (`step(epoch + 1)` at
    the end of each epoch). (DeiT's main.py calls `step(epoch)` there, so its
    epoch e > 0 runs at lr(e - 1).)

    Args:
        peak: the rate after the warmup, e.g. `scaled_learning_rate(batch)`.
        epochs: T, timm's `t_initial` (DeiT `--epochs`).
        steps_per_epoch: optimizer steps per epoch.
        warmup_epochs: W (DeiT `--warmup-epochs 5`).
        warmup_start: the rate of epoch 0 (DeiT `--warmup-lr 1e-6`).
        minimum: the final rate (DeiT `--min-lr 1e-5`).
    """

    def __init__(
        self,
        peak,
        epochs,
        steps_per_epoch,
        warmup_epochs=WARMUP_EPOCHS,
        warmup_start=WARMUP_LEARNING_RATE,
        minimum=MIN_LEARNING_RATE,
    ):
        _check_numbers(peak=peak, epochs=epochs, steps_per_epoch=steps_per_epoch, warmup_epochs=warmup_epochs,
                       warmup_start=warmup_start, minimum=minimum)
        _check_count("epochs", epochs)
        _check_count("steps_per_epoch", steps_per_epoch)
        if not 0 <= warmup_epochs < epochs:
            raise _out_of_range("warmup_epochs", warmup_epochs, ["at least 0 and shorter than the run of ",
                                                                 Named("epochs", epochs)], min(_EXAMPLES["warmup_epochs"], epochs - 1))
        _check_rates(peak, warmup_start, minimum)
        self.peak = float(peak)
        self.epochs = int(epochs)
        self.steps_per_epoch = int(steps_per_epoch)
        self.warmup_epochs = float(warmup_epochs)
        self.warmup_start = float(warmup_start)
        self.minimum = float(minimum)

    def __call__(self, step):
        epoch = ops.floor(ops.cast(step, "float32") / self.steps_per_epoch)
        warmup = self.warmup_start + (self.peak - self.warmup_start) * epoch / max(
            self.warmup_epochs, 1.0
        )
        cosine = self.minimum + 0.5 * (self.peak - self.minimum) * (
            1.0 + ops.cos(math.pi * ops.minimum(epoch, self.epochs) / self.epochs)
        )
        return ops.where(epoch < self.warmup_epochs, warmup, cosine)

    def get_config(self):
        return {
            "peak": self.peak,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "warmup_epochs": self.warmup_epochs,
            "warmup_start": self.warmup_start,
            "minimum": self.minimum,
        }
