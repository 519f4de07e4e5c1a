"""`keras-cait train | finetune | evaluate`: the runs built from `keras_cait.training`.

Each `*_parser()` lists the flags with their defaults and sources; each
`*_run(args)` does the work with the pieces of `keras_cait.training`;
`main(command, argv)` parses and runs one. scripts/train.py, finetune.py and
evaluate.py call the same commands.
"""

import argparse
import contextlib
import json
import os

import keras

from keras_cait.model import build_cait
from keras_cait.training import augment, distribute, lora, optimizer, resume, schedule, sources, stream, transfer
from keras_cait.training.callbacks import run_callbacks
from keras_cait.variants import cait

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# The fine-tuning rates are given for the default batch of one device, as in
# Keras' transfer-learning guide (Adam 1e-3 for the head, 1e-5 for everything).
FINETUNE_REFERENCE_BATCH = 64


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _parser(description, command):
    return argparse.ArgumentParser(
        prog=f"keras-cait {command}", description=description, formatter_class=_Formatter
    )


def _add_data_arguments(parser, train):
    group = parser.add_argument_group("data")
    spec = "a folder of class subfolders, tfrecord:PATTERN or tfds:NAME:SPLIT"
    if train:
        group.add_argument("--data", required=True, help=f"training images: {spec}")
        group.add_argument("--val-data", help=f"validation images: {spec}")
    else:
        group.add_argument("--data", required=True, help=f"images to evaluate: {spec}")
    group.add_argument("--class-names", help="file with one class name per line (for tfrecord:)")
    group.add_argument("--tfds-dir", help="TensorFlow Datasets data_dir (for tfds:)")
    group.add_argument("--image-size", type=int, default=224, help="side of the input images")
    group.add_argument("--crop-pct", type=float, default=1.0,
                       help="evaluation centre crop fraction (CaiT: 1.0)")


def _add_run_arguments(parser, backup_every):
    group = parser.add_argument_group("run")
    group.add_argument("--output-dir", required=True,
                       help="best.keras, final.keras, TensorBoard logs/ and backup/ go here; "
                            "rerunning the same command resumes a killed run")
    group.add_argument("--batch-size", type=int, default=64,
                       help="batch per replica (GPU); the global batch is this × replicas")
    group.add_argument("--precision", choices=PRECISIONS, default="mixed_float16",
                       help="Keras dtype policy (DeiT trains with AMP float16)")
    group.add_argument("--strategy", choices=distribute.STRATEGIES, default="none",
                       help="none, mirrored (GPUs of this host), multiworker (hosts, TF_CONFIG), "
                            "dataparallel (JAX backend)")
    group.add_argument("--seed", type=int, default=0, help="seed of weights init and data")
    group.add_argument("--deterministic", action="store_true",
                       help="deterministic TensorFlow ops (slower; exact resumption)")
    group.add_argument("--no-jit", dest="jit_compile", action="store_false",
                       help="do not compile the training step with XLA")
    group.add_argument("--backup-every", type=int, default=backup_every,
                       help="steps between backups of the whole training state")
    group.add_argument("--cache", action="store_true", help="keep encoded images in memory")
    group.add_argument("--shuffle-buffer", type=int, default=None,
                       help="examples held for shuffling (default: all)")
    group.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                       help="Keras progress: 1 bar, 2 one line per epoch, 0 silent")


def _add_augmentation_arguments(parser, full_recipe):
    on = full_recipe
    group = parser.add_argument_group(
        "augmentation" + (" (DeiT/CaiT defaults)" if on else " (lighter than training)")
    )
    group.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    group.add_argument("--mixup", type=float, default=0.8 if on else 0.0,
                       help="mixup alpha, 0 disables")
    group.add_argument("--cutmix", type=float, default=1.0 if on else 0.0,
                       help="cutmix alpha, 0 disables")
    group.add_argument("--mixup-switch-prob", type=float, default=0.5,
                       help="probability of cutmix when both are on")
    group.add_argument("--randaugment", type=float, default=9 if on else 0,
                       help="RandAugment magnitude of 10, 0 disables")
    group.add_argument("--reprob", type=float, default=0.25 if on else 0.0,
                       help="random erasing probability")
    group.add_argument("--repeated-aug", type=int, default=3 if on else 1,
                       help="augmented copies of each image per epoch, 1 disables")
    group.add_argument("--drop-path", type=float, default=0.1,
                       help="stochastic depth rate, the same in every block")


def _add_optimizer_arguments(parser, full_recipe):
    group = parser.add_argument_group("optimizer (AdamW)")
    group.add_argument("--weight-decay", type=float, default=optimizer.WEIGHT_DECAY,
                       help="decoupled weight decay (no decay on biases, norms, "
                            "LayerScale, pos_embed, cls_token)")
    group.add_argument("--clip-grad", type=float, default=None, help="gradient norm clipping")
    group.add_argument("--model-ema", action=argparse.BooleanOptionalAction, default=full_recipe,
                       help="keep a moving average of the weights; the final model gets it")
    group.add_argument("--model-ema-decay", type=float, default=optimizer.EMA_MOMENTUM,
                       help="EMA decay per step")
    group.add_argument("--min-lr", type=float,
                       default=schedule.MIN_LEARNING_RATE if full_recipe else 0.0,
                       help="learning rate at the end of the cosine")


def train_parser():
    parser = _parser(
        "Train a CaiT from scratch with the DeiT/CaiT recipe (AdamW, warmup + cosine, "
        "RandAugment, mixup/cutmix, random erasing, repeated augmentation, stochastic "
        "depth, EMA). Defaults are DeiT's main.py; CaiT trains 400 epochs.",
        "train",
    )
    parser.add_argument("--model", default="S24",
                        help="CaiT variant (XXS24, XXS36, XS24, S24, ...) or a JSON object of "
                             'build_cait arguments, e.g. \'{"embed_dim": 192, "depth": 12, '
                             '"num_heads": 4, "init_values": 1e-5}\'')
    _add_data_arguments(parser, train=True)
    _add_run_arguments(parser, backup_every=1000)
    parser.add_argument("--epochs", type=int, default=400, help="training epochs")
    group = parser.add_argument_group("learning rate")
    group.add_argument("--lr", type=float, default=schedule.BASE_LEARNING_RATE,
                       help="rate for a global batch of 512, scaled linearly with the batch")
    group.add_argument("--warmup-epochs", type=float, default=schedule.WARMUP_EPOCHS,
                       help="linear warmup epochs")
    group.add_argument("--warmup-lr", type=float, default=schedule.WARMUP_LEARNING_RATE,
                       help="rate at the first step")
    _add_optimizer_arguments(parser, full_recipe=True)
    _add_augmentation_arguments(parser, full_recipe=True)
    return parser


def finetune_parser():
    parser = _parser(
        "Fine-tune a CaiT on a folder of images: a new head is trained with the backbone "
        "frozen, then the whole network with a lower learning rate (Keras' transfer-learning "
        "recipe), at any resolution (the position embedding is resized).",
        "finetune",
    )
    parser.add_argument("--model", default="XXS24",
                        help="CaiT variant (XXS24, S24, ...) or the path of a .keras model")
    parser.add_argument("--weights", default="imagenet",
                        help="for a variant: imagenet, none, or a weights file")
    _add_data_arguments(parser, train=True)
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="held out for validation when --val-data is not given (0: none)")
    _add_run_arguments(parser, backup_every=200)
    group = parser.add_argument_group("schedule")
    group.add_argument("--head-epochs", type=int, default=2,
                       help="epochs training the new head only, backbone frozen")
    group.add_argument("--head-lr", type=float, default=1e-3,
                       help="learning rate of the head epochs for a global batch of 64 "
                            "(scaled linearly with the batch)")
    group.add_argument("--epochs", type=int, default=10,
                       help="epochs fine-tuning the whole network afterwards")
    group.add_argument("--lr", type=float, default=1e-5,
                       help="peak learning rate of the fine-tuning epochs (cosine decay) for a "
                            "global batch of 64 (scaled linearly with the batch)")
    group.add_argument("--lora-rank", type=int, default=0,
                       help="fine-tune rank-R LoRA updates of the attention projections and the "
                            "head instead of the whole network (0: the whole network); LoRA "
                            "takes a higher --lr, e.g. 1e-3")
    _add_optimizer_arguments(parser, full_recipe=False)
    _add_augmentation_arguments(parser, full_recipe=False)
    return parser


def evaluate_parser():
    parser = _parser("Top-1 / top-5 accuracy of a CaiT on a folder of images or a TFDS split.", "evaluate")
    parser.add_argument("--model", default="S24",
                        help="CaiT variant (with --weights) or the path of a .keras model")
    parser.add_argument("--weights", default="imagenet",
                        help="for a variant: imagenet or a weights file")
    _add_data_arguments(parser, train=False)
    parser.add_argument("--batch-size", type=int, default=64, help="evaluation batch size")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32", help="dtype policy")
    return parser


def _configure(args):
    keras.utils.set_random_seed(args.seed)
    if getattr(args, "deterministic", False):
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(args.precision)


def _class_names(args):
    if not args.class_names:
        return None
    with open(args.class_names) as file:
        return [line.strip() for line in file if line.strip()]


def _sources(args):
    class_names = _class_names(args)
    train = sources.source(args.data, class_names, args.tfds_dir)
    if args.val_data:
        return train, sources.source(args.val_data, class_names, args.tfds_dir)
    if getattr(args, "val_fraction", 0):
        return sources.split(train, args.val_fraction, seed=args.seed)
    return train, None


def _augmentation(args, num_classes):
    return augment.Augmentation(
        image_size=args.image_size,
        num_classes=num_classes,
        rand_augment_magnitude=args.randaugment,
        random_erasing=args.reprob,
        mixup_alpha=args.mixup,
        cutmix_alpha=args.cutmix,
        switch_prob=args.mixup_switch_prob,
        label_smoothing=args.smoothing,
        repeats=args.repeated_aug,
    )


def _metrics(num_classes):
    metrics = [keras.metrics.CategoricalAccuracy(name="accuracy")]
    if num_classes > 5:
        metrics.append(keras.metrics.TopKCategoricalAccuracy(5, name="top5"))
    return metrics


def _output_dir(args, distribution):
    # Every worker saves (Keras' multi-worker rule); only the chief's files are the run's.
    if distribution.is_chief:
        return args.output_dir
    return os.path.join(args.output_dir, "workers", str(distribution.worker_index))


def _compile(model, args, peak, epochs, steps, warmup_epochs=0, warmup_start=0.0):
    learning_rate = schedule.warmup_cosine(
        peak,
        total_steps=epochs * steps,
        warmup_steps=round(warmup_epochs * steps),
        warmup_start=warmup_start,
        minimum=min(args.min_lr, peak),
    )
    model.compile(
        optimizer=optimizer.adamw(
            model,
            learning_rate,
            weight_decay=args.weight_decay,
            clipnorm=args.clip_grad,
            use_ema=args.model_ema,
            ema_momentum=args.model_ema_decay,
        ),
        loss=keras.losses.CategoricalCrossentropy(),
        metrics=_metrics(model.output_shape[-1]),
        jit_compile="auto" if args.jit_compile else False,
    )


def _train(model, args, train, validation, distribution, epochs, output_dir, backup_name, seed):
    """One resumable `fit` of `epochs` epochs; returns its History (None if already done)."""
    global_batch = distribution.global_batch_size(args.batch_size)
    steps = stream.steps_per_epoch(train, global_batch)
    callbacks, backup = run_callbacks(
        output_dir,
        os.path.join(output_dir, "backup", backup_name),
        args.backup_every,
        monitor="val_accuracy" if validation else "loss",
    )
    augmentation = _augmentation(args, train.num_classes)

    def stream_from(step):
        return stream.training_stream(
            train, augmentation, global_batch, epochs, seed=seed, start_step=step,
            shuffle_buffer=args.shuffle_buffer, cache=args.cache,
        )

    history = resume.fit(
        model, stream_from, epochs, steps, backup=backup, callbacks=callbacks,
        validation_data=validation, verbose=args.verbose,
    )
    with contextlib.suppress(OSError):  # the backups' folder, once no run needs it
        os.rmdir(os.path.dirname(backup.backup_dir))
    return history


def _validation(args, validation, global_batch):
    if validation is None:
        return None
    return stream.evaluation_dataset(
        validation, args.image_size, global_batch, args.crop_pct, one_hot=True, cache=True
    )


def _save(model, path):
    model.save(path[: -len(".keras")] + ".partial.keras")
    os.replace(path[: -len(".keras")] + ".partial.keras", path)


def _new_model(args, classes):
    shape = dict(input_shape=(args.image_size, args.image_size, 3), classes=classes,
                 drop_path_rate=args.drop_path)
    if args.model.lstrip().startswith("{"):
        return build_cait(**json.loads(args.model), **shape)
    return cait(args.model, weights=None, **shape)


def _announce(distribution, args, global_batch, steps, peak):
    print(
        f"{distribution.name}: {distribution.replicas} replica(s), global batch {global_batch} "
        f"({args.batch_size} per replica), {steps} steps per epoch, peak learning rate {peak:.3g}",
        flush=True,
    )


def train_run(args):
    """Trains `args.model` from scratch; writes best.keras and final.keras."""
    _configure(args)
    distribution = distribute.distribution(args.strategy)
    train, validation = _sources(args)
    global_batch = distribution.global_batch_size(args.batch_size)
    steps = stream.steps_per_epoch(train, global_batch)
    output_dir = _output_dir(args, distribution)
    with distribution.scope():
        model = _new_model(args, train.num_classes)
        peak = schedule.scaled_learning_rate(global_batch, args.lr)
        _compile(
            model, args, peak, args.epochs, steps,
            warmup_epochs=args.warmup_epochs, warmup_start=args.warmup_lr,
        )
    _announce(distribution, args, global_batch, steps, peak)
    _train(model, args, train, _validation(args, validation, global_batch), distribution,
           args.epochs, output_dir, "train", args.seed)
    _save(model, os.path.join(output_dir, "final.keras"))
    return model


def _load_backbone(args):
    """A CaiT without head at `args.image_size`: a variant with its weights, or a .keras model."""
    size = args.image_size
    if args.model.endswith(".keras"):
        model = keras.models.load_model(args.model)
        if model.input_shape[1:3] != (size, size):
            model = transfer.at_resolution(model, size)
        return model
    weights = None if args.weights.lower() == "none" else args.weights
    return cait(
        args.model, include_top=False, pooling="token", weights=weights,
        input_shape=(size, size, 3), drop_path_rate=args.drop_path,
    )


def _check_lora_can_start(output_dir):
    """A LoRA stage cannot resume: Keras saves LoRA merged into the kernel and zeroes A and B on loading."""
    backup = os.path.join(output_dir, "backup", "lora")
    if os.path.exists(backup):
        raise ValueError(
            f"{backup} holds a backup of an interrupted LoRA stage, which cannot be resumed (Keras "
            "saves the LoRA update merged into the kernel, and A = B = 0 would not train); "
            f"remove {backup} to run the LoRA stage again from the trained head."
        )


def finetune_run(args):
    """Fine-tunes a CaiT on new classes; writes head.weights.h5, best.keras and final.keras."""
    _configure(args)
    distribution = distribute.distribution(args.strategy)
    train, validation = _sources(args)
    global_batch = distribution.global_batch_size(args.batch_size)
    steps = stream.steps_per_epoch(train, global_batch)
    validation = _validation(args, validation, global_batch)
    output_dir = _output_dir(args, distribution)
    head_weights = os.path.join(output_dir, "head.weights.h5")

    def scaled(rate):
        return schedule.scaled_learning_rate(global_batch, rate, FINETUNE_REFERENCE_BATCH)

    _announce(distribution, args, global_batch, steps, scaled(args.lr))
    with distribution.scope():
        model = transfer.with_new_head(_load_backbone(args), train.num_classes, name="cait_finetuned")
    if args.head_epochs:
        if os.path.exists(head_weights):
            model.load_weights(head_weights)
        else:
            transfer.set_backbone_trainable(model, False)
            with distribution.scope():
                _compile(model, args, scaled(args.head_lr), args.head_epochs, steps)
            _train(model, args, train, validation, distribution, args.head_epochs,
                   output_dir, "head", args.seed)
            model.optimizer = None
            model.save_weights(head_weights[: -len(".weights.h5")] + ".partial.weights.h5")
            os.replace(head_weights[: -len(".weights.h5")] + ".partial.weights.h5", head_weights)
    if args.epochs:
        with distribution.scope():
            if args.lora_rank:
                _check_lora_can_start(output_dir)
                lora.enable_lora(model, args.lora_rank)
            else:
                transfer.set_backbone_trainable(model, True)
            _compile(model, args, scaled(args.lr), args.epochs, steps)
        _train(model, args, train, validation, distribution, args.epochs,
               output_dir, "lora" if args.lora_rank else "full", args.seed + 1)
    if args.lora_rank:
        model = lora.merge_lora(model)
    _save(model, os.path.join(output_dir, "final.keras"))
    return model


def evaluate_run(args):
    """Prints and returns {"top1": ..., "top5": ..., "images": ...} of the model on the data."""
    keras.mixed_precision.set_global_policy(args.precision)
    source = sources.source(args.data, _class_names(args), args.tfds_dir)
    if args.model.endswith(".keras"):
        model = keras.models.load_model(args.model)
    else:
        model = cait(args.model, weights=args.weights,
                     input_shape=(args.image_size, args.image_size, 3))
    classes = model.output_shape[-1]
    if classes != source.num_classes:
        raise ValueError(
            f"The model predicts {classes} classes but {args.data} has {source.num_classes}; "
            "evaluate on data with the model's classes in the same (sorted) order."
        )
    metrics = [keras.metrics.SparseTopKCategoricalAccuracy(1, name="top1")]
    if classes >= 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5"))
    # Keras evaluates a loss in any case; only the accuracies are reported.
    model.compile(loss="sparse_categorical_crossentropy", metrics=metrics, jit_compile=False)
    dataset = stream.evaluation_dataset(source, args.image_size, args.batch_size, args.crop_pct)
    results = model.evaluate(dataset, return_dict=True, verbose=1)
    report = {name: float(value) for name, value in results.items() if name != "loss"}
    report["images"] = source.num_examples
    print(json.dumps(report))
    return report


COMMANDS = {
    "train": (train_parser, train_run),
    "finetune": (finetune_parser, finetune_run),
    "evaluate": (evaluate_parser, evaluate_run),
}


def main(command, argv=None):
    """Parses `argv` with the command's parser and runs it, e.g. `main("evaluate", [...])`."""
    parser, run = COMMANDS[command]
    run(parser().parse_args(argv))
