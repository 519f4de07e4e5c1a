"""A training recipe as one object: every knob of a run, and the named recipes in one table.

    Recipe            every knob (`keras_cait.training.knobs.Knobs`: optimizer, schedule,
                      augmentation, drop path, EMA, distillation) and what a run builds from them
    RECIPES           deit, deit-highres, transfer, scratch (and demo, its former name)
    DEIT              RECIPES["deit"], whose values are the defaults of keras_cait.training

A recipe builds what a run trains with, for Keras users and the command line alike:

    recipe = RECIPES["transfer"].replace(epochs=5)
    model.compile(optimizer=recipe.optimizer(model, global_batch=64, steps_per_epoch=100), ...)
    batches = training_stream(source, recipe.augmentation(224, source.num_classes), 64, recipe.epochs)

`keras-cait train` and `finetune` take a flag for every knob (`--` and the field's name with
dashes), with the defaults of `--recipe NAME`; a flag typed on the command line always wins.
A run writes the recipe it ran to `recipe.json` beside its model (`Recipe.load` reads it).
"""

import dataclasses
import difflib
import numbers

from keras_cait.errors import ArgumentError, Named, checked_bool
from keras_cait.models.surgery import check_model_object
from keras_cait.training import schedule
from keras_cait.training.augment import Augmentation
# What the command line reads of the knobs, here with the recipes.
from keras_cait.training.knobs import GROUPS, KnobError, Knobs, flag, knobs, out_of_range, shown
from keras_cait.training.optimizer import adamw

__all__ = ["DEIT", "GROUPS", "RECIPES", "KnobError", "Knobs", "Recipe", "flag", "knobs", "out_of_range", "shown"]


@dataclasses.dataclass(frozen=True)
class Recipe(Knobs):
    """Every knob of a training run (`Knobs`, whose defaults are DeiT's) and what a run builds
    from them: the learning rate and its schedule, AdamW, the augmentation.
    """

    # === What a run builds from it ===

    def peak_lr(self, global_batch, head=False):
        """The peak rate of a run with `global_batch` images per step (the head's with `head`)."""
        global_batch, _, head = self._checked_run(global_batch, 1, head)
        return schedule.scaled_learning_rate(global_batch, self.head_lr if head else self.lr, self.lr_batch)

    def learning_rate(self, global_batch, steps_per_epoch, head=False):
        """The rate schedule of the whole-network epochs (or, with `head`, of the head epochs: a
        cosine over them without warmup)."""
        global_batch, steps_per_epoch, head = self._checked_run(global_batch, steps_per_epoch, head)
        peak = self.peak_lr(global_batch, head)
        minimum = min(self.min_lr, peak)
        if head:
            return schedule.warmup_cosine(peak, self.head_epochs * steps_per_epoch, 0, 0.0, minimum)
        if self.sched == "epoch":
            return schedule.EpochCosine(peak, self.epochs, steps_per_epoch, self.warmup_epochs, self.warmup_lr,
                                        minimum=minimum)
        total = self.epochs * steps_per_epoch
        # Rounded to steps, a warmup shorter than the run in epochs (1.5 of 2, at 1 step an epoch) could
        # fill it, which warmup_cosine refuses naming its own warmup_steps: at most the run less one step.
        return schedule.warmup_cosine(peak, total, min(round(self.warmup_epochs * steps_per_epoch), total - 1),
                                      self.warmup_lr, minimum)

    def optimizer(self, model, global_batch, steps_per_epoch, head=False):
        """AdamW on `model` (DeiT's decay set) with the recipe's schedule, clipping and EMA.

        With `model_ema` Keras' `fit` puts the moving average (about 25,000 steps long at DeiT's
        decay) into the model when it ends: pass `callbacks=[MovingAverageFile("ema.keras")]`
        (`keras_cait.training.callbacks`) to keep the trained weights in the model, as DeiT and
        the runs do (docs/training.md)."""
        check_model_object(model, "Recipe.optimizer")
        self._checked_run(global_batch, steps_per_epoch, head)
        beta_1, beta_2 = self.opt_betas
        return adamw(model, self.learning_rate(global_batch, steps_per_epoch, head), weight_decay=self.weight_decay,
                     beta_1=beta_1, beta_2=beta_2, epsilon=self.opt_eps, global_clipnorm=self.clip_grad,
                     use_ema=self.model_ema, ema_momentum=self.model_ema_decay)

    @classmethod
    def named(cls):
        return RECIPES

    def _checked_run(self, global_batch, steps_per_epoch, head):
        """`(global_batch, steps_per_epoch, head)` of the methods above, each refused in its own name
        (the schedule's functions would name theirs: `global_batch_size`, `total_steps`)."""
        head = checked_bool("head", head, "True (the head-only epochs) or False (the whole network's)")
        if head and not self.head_epochs:
            raise ArgumentError("head", head, ["this recipe has no head-only epochs (", Named("head_epochs", 0), ")"],
                                ["give it some, recipe.replace(", Named("head_epochs", 2), "), or use head=False"],
                                usage=True)
        return _whole("global_batch", global_batch, 512), _whole("steps_per_epoch", steps_per_epoch, 2502), head

    def augmentation(self, image_size, num_classes):
        """The per-image and per-batch augmentation (`training_stream` takes it)."""
        return Augmentation(image_size=image_size, num_classes=num_classes, rand_augment_magnitude=self.randaugment,
                            random_erasing=self.reprob, mixup_alpha=self.mixup, cutmix_alpha=self.cutmix,
                            switch_prob=self.mixup_switch_prob, label_smoothing=self.smoothing,
                            repeats=self.repeated_aug)


def _whole(argument, value, example):
    """`value` where it is a positive whole number (`64.0` too, as the schedule's functions take it: a
    config's float), else an `ArgumentError` naming `argument`."""
    number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if number and value > 0 and float(value).is_integer():
        return value
    raise ArgumentError(argument, value, "must be a positive whole number" + ("" if number else
                        f", not {type(value).__name__}"), ["e.g. ", Named(argument, example)], usage=True)


DEIT = Recipe()


class _Recipes(dict):
    """`RECIPES`: a dict whose missing name is a `KeyError` that lists the names it has."""

    def __missing__(self, name):
        close = difflib.get_close_matches(str(name), list(self), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(f"RECIPES has no recipe {name!r}; {hint}its recipes: {', '.join(self)}")


RECIPES = _Recipes({
    # CaiT/DeiT from scratch: DeiT's main.py (facebookresearch/deit) with CaiT's 400 epochs
    # (arXiv 2103.17239, section 4). `keras-cait train`'s default.
    "deit": DEIT,
    # DeiT's fine-tuning at a higher resolution (facebookresearch/deit README: "--input-size 384
    # --lr 5e-6 --weight-decay 1e-8 --epochs 30 --min-lr 5e-6", per 512 images), keeping the head.
    "deit-highres": DEIT.replace(lr=5e-6, weight_decay=1e-8, epochs=30, min_lr=5e-6, keep_head=True),
    # Keras' transfer-learning guide: a new head at Adam 1e-3 with the backbone frozen, then the
    # whole network at 1e-5, rates for one device's batch of 64; light augmentation, no EMA.
    # `keras-cait finetune`'s default.
    "transfer": DEIT.replace(lr=1e-5, lr_batch=64, epochs=10, warmup_epochs=0.0, warmup_lr=0.0, min_lr=0.0,
                             sched="step", head_epochs=2, head_lr=1e-3, randaugment=0.0, reprob=0.0, mixup=0.0,
                             cutmix=0.0, repeated_aug=1, model_ema=False),
    # A CaiT from random weights on a small folder (hundreds to a few thousand images), as
    # `keras-cait demo` trains one on scikit-learn's digits at 32x32: batch 32 at 2e-3, 15 epochs,
    # a tenth of them warmup, per step; no augmentation, smoothing or drop path (the demo reaches
    # 95-97 % held out over 3 seeds; docs/demo.md has the ablation). `finetune` takes it when given
    # weights=None and no recipe.
    "scratch": DEIT.replace(batch_size=32, lr=2e-3, lr_batch=32, epochs=15, warmup_epochs=1.5, sched="step",
                            randaugment=0.0, reprob=0.0, mixup=0.0, cutmix=0.0, repeated_aug=1, smoothing=0.0,
                            drop_path=0.0, model_ema=False),
})
# Its former name, kept for `--recipe demo` and code that reads it: the same recipe.
RECIPES["demo"] = RECIPES["scratch"]


class RecipeName(str):
    """A name of `RECIPES` as the value of a `keras_cait.errors.Named("recipe", ...)` in a line the
    library says: `recipe=RECIPES['scratch']` from Python, `--recipe scratch` on the command line."""

    def __repr__(self):
        return f"RECIPES[{str(self)!r}]"
