"""A training recipe as one object: every knob of a run, and the named recipes in one table.

    Recipe            the knobs: optimizer, schedule, augmentation, drop path, EMA, distillation
    RECIPES           deit, deit-highres, transfer, demo
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
import json
import math

from keras_cait import atomic

GROUPS = ("optimizer (AdamW)", "schedule", "augmentation", "regularisation", "distillation")


def knob(default, help, group, low=None, high=None, choices=None, positive=False):  # noqa: A002  argparse's word
    """A field of `Recipe`: its default is DeiT's; the rest is what the command line shows and checks
    (`low`/`high`: the allowed range; `positive`: above 0)."""
    return dataclasses.field(default=default, metadata=dict(help=help, group=group, low=low, high=high,
                                                              choices=choices, positive=positive))


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Every knob of a training run. The defaults are DeiT's main.py (facebookresearch/deit), which
    CaiT's training reuses, with CaiT's 400 epochs; `RECIPES` says where each recipe's values come from.

    Learning rates are quoted for a global batch of `lr_batch` images and scaled linearly with
    the global batch of the run (DeiT's rule). A fine-tuning run with `head_epochs` first trains a
    new head alone at `head_lr`; `keep_head` keeps a loaded model's head when it predicts the
    run's classes (DeiT's `--finetune`).
    """

    # Optimizer: DeiT --opt adamw --lr 5e-4 (per 512 images) --weight-decay 0.05 --opt-eps 1e-8.
    batch_size: int = knob(64, "batch per replica (GPU); the global batch is this × replicas", "optimizer (AdamW)",
                           low=1)
    lr: float = knob(5e-4, "peak learning rate for a global batch of --lr-batch, scaled linearly with the batch",
                     "optimizer (AdamW)", low=0.0)
    lr_batch: int = knob(512, "the global batch --lr and --head-lr are quoted for", "optimizer (AdamW)", low=1)
    weight_decay: float = knob(0.05, "decoupled weight decay (none on biases, norms, LayerScale, pos_embed, "
                                     "cls_token)", "optimizer (AdamW)", low=0.0)
    opt_betas: tuple = knob((0.9, 0.999), "AdamW's beta_1 and beta_2", "optimizer (AdamW)", low=0.0, high=1.0)
    opt_eps: float = knob(1e-8, "AdamW's epsilon (Keras' own default is 1e-7)", "optimizer (AdamW)", low=0.0)
    clip_grad: float = knob(None, "clip the norm of all gradients taken together (timm's clip_grad_norm_); off "
                                  "when not given", "optimizer (AdamW)", low=0.0)
    # Schedule: DeiT --sched cosine --warmup-epochs 5 --warmup-lr 1e-6 --min-lr 1e-5; CaiT 400 epochs.
    epochs: int = knob(400, "training epochs (after the head epochs)", "schedule", low=0)
    warmup_epochs: float = knob(5.0, "linear warmup epochs", "schedule", low=0.0)
    warmup_lr: float = knob(1e-6, "learning rate of the first step", "schedule", low=0.0)
    min_lr: float = knob(1e-5, "learning rate at the end of the cosine", "schedule", low=0.0)
    sched: str = knob("epoch", "epoch: one rate per epoch, the warmup laid over the cosine (timm's "
                               "CosineLRScheduler, DeiT's); step: per step, the warmup before the cosine",
                      "schedule", choices=("epoch", "step"))
    head_epochs: int = knob(0, "fine-tuning: epochs training a new head alone, the backbone frozen",
                            "schedule", low=0)
    head_lr: float = knob(1e-3, "fine-tuning: learning rate of the head epochs for a global batch of --lr-batch",
                          "schedule", low=0.0)
    keep_head: bool = knob(False, "fine-tuning: keep a loaded model's head when it predicts the data's classes",
                           "schedule")
    # Augmentation: DeiT --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0
    # --mixup-switch-prob 0.5 --smoothing 0.1 --repeated-aug (3 copies).
    randaugment: float = knob(9.0, "RandAugment magnitude of 10, 0 disables", "augmentation", low=0.0, high=10.0)
    reprob: float = knob(0.25, "random erasing probability", "augmentation", low=0.0, high=1.0)
    mixup: float = knob(0.8, "mixup alpha, 0 disables", "augmentation", low=0.0)
    cutmix: float = knob(1.0, "cutmix alpha, 0 disables", "augmentation", low=0.0)
    mixup_switch_prob: float = knob(0.5, "probability of cutmix when both are on", "augmentation", low=0.0, high=1.0)
    repeated_aug: int = knob(3, "augmented copies of each image per epoch, 1 disables", "augmentation", low=1)
    smoothing: float = knob(0.1, "label smoothing", "augmentation", low=0.0, high=0.99)
    # Regularisation: DeiT-S --drop-path 0.1 (CaiT's S models 0.1); --model-ema-decay 0.99996.
    drop_path: float = knob(0.1, "stochastic depth rate, the same in every block", "regularisation",
                            low=0.0, high=0.99)
    model_ema: bool = knob(True, "keep a moving average of the weights, saved as ema.keras; best.keras and "
                                 "final.keras keep the raw weights", "regularisation")
    model_ema_decay: float = knob(0.99996, "EMA decay per step", "regularisation", low=0.0, high=1.0)
    # Distillation: DeiT --distillation-type none --distillation-alpha 0.5 --distillation-tau 1.0.
    distillation_type: str = knob("none", "hard: cross-entropy with the teacher's class; soft: KL at "
                                          "--distillation-tau (needs --teacher)", "distillation",
                                  choices=("none", "soft", "hard"))
    distillation_alpha: float = knob(0.5, "weight of the distillation term", "distillation", low=0.0, high=1.0)
    distillation_tau: float = knob(1.0, "temperature of soft distillation", "distillation", positive=True)

    def __post_init__(self):
        if isinstance(self.opt_betas, list):  # as JSON gives it back
            object.__setattr__(self, "opt_betas", tuple(self.opt_betas))
        for field in dataclasses.fields(self):
            problem = out_of_range(field, getattr(self, field.name))
            if problem:
                raise RecipeError(field.name, getattr(self, field.name), problem)

    def replace(self, **changes):
        """A copy with `changes`, e.g. `RECIPES["deit"].replace(epochs=30)`; a knob out of its range
        is refused (`RecipeError`) with this recipe's value as the example."""
        unknown = sorted(set(changes) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"Recipe has no knob {', '.join(unknown)}; its knobs: {', '.join(knobs())}.")
        for name, value in changes.items():
            problem = out_of_range(_field(name), value, example=getattr(self, name) or None)
            if problem:
                raise RecipeError(name, value, problem)
        return dataclasses.replace(self, **changes)

    # === What a run builds from it ===

    def peak_lr(self, global_batch, head=False):
        """The peak rate of a run with `global_batch` images per step (the head's with `head`)."""
        from keras_cait.training.schedule import scaled_learning_rate

        return scaled_learning_rate(global_batch, self.head_lr if head else self.lr, self.lr_batch)

    def learning_rate(self, global_batch, steps_per_epoch, head=False):
        """The rate schedule of the whole-network epochs (or, with `head`, of the head epochs: a
        cosine over them without warmup)."""
        from keras_cait.training import schedule

        peak = self.peak_lr(global_batch, head)
        minimum = min(self.min_lr, peak)
        if head:
            return schedule.warmup_cosine(peak, self.head_epochs * steps_per_epoch, 0, 0.0, minimum)
        if self.sched == "epoch":
            return schedule.EpochCosine(peak, self.epochs, steps_per_epoch, self.warmup_epochs, self.warmup_lr,
                                        minimum=minimum)
        return schedule.warmup_cosine(peak, self.epochs * steps_per_epoch,
                                      round(self.warmup_epochs * steps_per_epoch), self.warmup_lr, minimum)

    def optimizer(self, model, global_batch, steps_per_epoch, head=False):
        """AdamW on `model` (DeiT's decay set) with the recipe's schedule, clipping and EMA."""
        from keras_cait.training.optimizer import adamw

        beta_1, beta_2 = self.opt_betas
        return adamw(model, self.learning_rate(global_batch, steps_per_epoch, head), weight_decay=self.weight_decay,
                     beta_1=beta_1, beta_2=beta_2, epsilon=self.opt_eps, global_clipnorm=self.clip_grad,
                     use_ema=self.model_ema, ema_momentum=self.model_ema_decay)

    def augmentation(self, image_size, num_classes):
        """The per-image and per-batch augmentation (`training_stream` takes it)."""
        from keras_cait.training.augment import Augmentation

        return Augmentation(image_size=image_size, num_classes=num_classes, rand_augment_magnitude=self.randaugment,
                            random_erasing=self.reprob, mixup_alpha=self.mixup, cutmix_alpha=self.cutmix,
                            switch_prob=self.mixup_switch_prob, label_smoothing=self.smoothing,
                            repeats=self.repeated_aug)

    # === As a file ===

    def as_dict(self):
        return {field.name: _plain(getattr(self, field.name)) for field in dataclasses.fields(self)}

    def save(self, path, name=None):
        """Writes the recipe as readable JSON (`{"recipe": name, "lr": ...}`), put in place whole."""
        atomic.write_text(path, json.dumps({"recipe": name, **self.as_dict()}, indent=2) + "\n")

    @classmethod
    def load(cls, path):
        """The recipe of a `recipe.json` (a run's, or one written by `save`)."""
        with open(path) as file:
            values = json.load(file)
        values.pop("recipe", None)
        return cls(**values)


class RecipeError(ValueError):
    """A knob out of its range: `knob`, its `value` and the `problem` ('must be at least 0, e.g. 0.05')."""

    def __init__(self, knob, value, problem):
        super().__init__(f"Recipe {knob}={value!r}: {problem}.")
        self.knob, self.value, self.problem = knob, value, problem


def _field(name):
    return next(field for field in dataclasses.fields(Recipe) if field.name == name)


def knobs():
    return [field.name for field in dataclasses.fields(Recipe)]


def flag(name):
    """The command-line flag of a knob: `warmup_epochs` -> `--warmup-epochs`."""
    return "--" + name.replace("_", "-")


def out_of_range(field, value, example=None):
    """What is wrong with `value` for the knob `field` ('' if nothing), e.g. 'must be at least 0,
    e.g. 0.05' (the example: `example`, else DeiT's value)."""
    low, high, choices = field.metadata["low"], field.metadata["high"], field.metadata["choices"]
    if choices is not None:
        return "" if value in choices else f"must be one of {', '.join(choices)}"
    positive = field.metadata["positive"]
    if value is None or isinstance(value, bool) or (low is None and high is None and not positive):
        return ""
    for item in value if isinstance(value, (tuple, list)) else (value,):
        if not math.isfinite(item) or (positive and item <= 0) or (low is not None and item < low) or (
                high is not None and item > high):
            allowed = "positive" if positive else f"at least {low:g}" if high is None else \
                f"between {low:g} and {high:g}"
            example = field.default if example is None else example
            return f"must be {allowed}" + ("" if example is None else f", e.g. {shown(example)}")
    return ""


def shown(value):
    """A number or a pair of numbers as the command line takes it: 0.9 0.999."""
    return " ".join(f"{item:g}" for item in value) if isinstance(value, (tuple, list)) else f"{value:g}"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


DEIT = Recipe()

RECIPES = {
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
    # `keras-cait demo` from scratch on scikit-learn's digits at 32x32: batch 32 at 2e-3, 15 epochs,
    # a tenth of them warmup, per step; no augmentation, smoothing or drop path (it reaches
    # 95-97 % held out over 3 seeds; docs/demo.md has the ablation).
    "demo": DEIT.replace(batch_size=32, lr=2e-3, lr_batch=32, epochs=15, warmup_epochs=1.5, sched="step",
                         randaugment=0.0, reprob=0.0, mixup=0.0, cutmix=0.0, repeated_aug=1, smoothing=0.0,
                         drop_path=0.0, model_ema=False),
}
