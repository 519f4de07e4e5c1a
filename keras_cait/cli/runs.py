"""`keras-cait train | finetune | evaluate`: the runs built from `keras_cait.training`.

Each `*_parser()` lists the flags with their defaults and sources; each
`*_run(args)` does the work with the pieces of `keras_cait.training`;
`check_arguments(command, args)` refuses what cannot work before any data are
read or model built; `main(command, argv)` parses, checks and runs one, keeping
the error contract of `keras_cait.cli.errors`. From a checkout without the console
script, `python -m keras_cait.cli train | finetune | evaluate` runs the same commands.
"""

import argparse
import contextlib
import dataclasses
import json
import os

import keras

from keras_cait.atomic import written_atomically
from keras_cait.model import build_cait, with_class_names
from keras_cait.cli.errors import (
    Parser,
    add_debug_flag,
    check_range,
    check_writable_folder,
    fail,
    load_keras_model,
    named_bad_images,
    reported,
    usage,
    user_input,
    weights_errors,
)
from keras_cait.training import distribute, lora, resume, sources, stream, transfer
from keras_cait.training import recipe as recipes
from keras_cait.training.callbacks import run_callbacks, save_model
from keras_cait.training.distillation import Distiller
from keras_cait.variants import cait, parse_model_name

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# Each command's recipe when --recipe is not given.
DEFAULT_RECIPES = {"train": "deit", "finetune": "transfer"}
# Knobs of a fine-tuning run's head stage: `train` has none.
_HEAD_KNOBS = ("head_epochs", "head_lr", "keep_head")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _parser(description, command):
    parser = Parser(prog=f"keras-cait {command}", description=description, formatter_class=_Formatter)
    add_debug_flag(parser)
    return parser


def _add_data_arguments(parser, train, model_file=False):
    group = parser.add_argument_group("data")
    spec = "a folder of class subfolders, tfrecord:PATTERN or tfds:NAME:SPLIT"
    if train:
        group.add_argument("--data", required=True, help=f"training images: {spec}")
        group.add_argument("--val-data", help=f"validation images: {spec}")
    else:
        group.add_argument("--data", required=True, help=f"images to evaluate: {spec}")
    group.add_argument("--class-names", help="file with one class name per line (for tfrecord:)")
    group.add_argument("--tfds-dir", help="TensorFlow Datasets data_dir (for tfds:)")
    if model_file:
        group.add_argument("--image-size", type=int, default=None,
                           help="side of the input images (default: the input size of a .keras "
                                "--model, else 224)")
    else:
        group.add_argument("--image-size", type=int, default=224, help="side of the input images")
    group.add_argument("--crop-pct", type=float, default=1.0,
                       help="evaluation centre crop fraction (CaiT: 1.0)")


def _add_run_arguments(parser, backup_every):
    group = parser.add_argument_group("run")
    group.add_argument("--output-dir", required=True,
                       help="best.keras, final.keras, TensorBoard logs/ and backup/ go here; "
                            "rerunning the same command resumes a killed run")
    group.add_argument("--precision", choices=PRECISIONS, default="mixed_float16",
                       help="Keras dtype policy (DeiT trains with AMP float16)")
    group.add_argument("--strategy", choices=distribute.STRATEGIES, default="none",
                       help="none, mirrored (GPUs of this host), multiworker (hosts, TF_CONFIG), "
                            "dataparallel (JAX backend: this host, or hosts with KERAS_DISTRIBUTION_*)")
    group.add_argument("--seed", type=int, default=0, help="seed of weights init and data")
    group.add_argument("--deterministic", action="store_true",
                       help="deterministic TensorFlow ops (slower; exact resumption)")
    group.add_argument("--jit", dest="jit_compile", action=argparse.BooleanOptionalAction,
                       default=True, help="compile the training step with XLA where Keras' jit_compile='auto' "
                                          "does (not TensorFlow on a machine without GPUs); --no-jit: never")
    group.add_argument("--backup-every", type=int, default=backup_every,
                       help="steps between backups of the whole training state")
    group.add_argument("--cache", action="store_true", help="keep encoded images in memory")
    group.add_argument("--shuffle-buffer", type=int, default=None,
                       help="examples held for shuffling (default: all)")
    group.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                       help="Keras progress: 1 bar, 2 one line per epoch, 0 silent")


def _add_teacher_argument(parser):
    parser.add_argument("--teacher",
                        help="the teacher of --distillation-type hard or soft (DeiT's; the paper: a "
                             "RegNetY-16GF teacher, hard distillation): a .keras model file or a "
                             "keras.applications model name (e.g. RegNetY160, with Keras' ImageNet "
                             "weights); it sees the student's 0..255 training batches and must "
                             "predict the same classes")


def _add_recipe_arguments(parser, command, name):
    """`--recipe` and a flag for every knob of `keras_cait.training.recipe.Recipe`, whose defaults
    are the recipe's: a flag typed on the command line wins, also when it equals the default."""
    recipe = recipes.RECIPES[name]
    parser.add_argument("--recipe", choices=recipes.RECIPES, default=name,
                        help="the training recipe whose values are the defaults of the flags below "
                             "(keras_cait.training.recipe.RECIPES; `--recipe NAME --help` shows them); "
                             "a flag given wins")
    groups = {group: parser.add_argument_group(f"{group}, recipe {name}") for group in recipes.GROUPS}
    for field in dataclasses.fields(recipe):
        if command == "train" and field.name in _HEAD_KNOBS:
            continue
        default, meta = getattr(recipe, field.name), field.metadata
        options = dict(default=default, help=meta["help"])
        if isinstance(default, bool):
            options["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, tuple):
            options.update(type=float, nargs=len(default), metavar=tuple(f"B{i + 1}" for i in range(len(default))))
        elif meta["choices"]:
            options["choices"] = meta["choices"]
        else:
            options["type"] = {"batch_size": int, "lr_batch": int, "epochs": int, "head_epochs": int,
                               "repeated_aug": int}.get(field.name, float)
        groups[meta["group"]].add_argument(recipes.flag(field.name), **options)


def recipe_of(args):
    """The recipe a parsed command line runs: `--recipe`'s, with every knob as the flags say."""
    values = {name: getattr(args, name) for name in recipes.knobs() if hasattr(args, name)}
    return recipes.RECIPES[args.recipe].replace(**values)


def _recipe_named(argv, command):
    """The `--recipe` of `argv` (the command's default if none or an unknown one, which the full
    parser then refuses), read before the parser is built: its values are the flags' defaults."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--recipe")
    named = early.parse_known_args(argv)[0].recipe
    return named if named in recipes.RECIPES else DEFAULT_RECIPES[command]


def train_parser(recipe="deit"):
    parser = _parser(
        "Train a CaiT from scratch with the DeiT/CaiT recipe (AdamW, warmup + cosine, "
        "RandAugment, mixup/cutmix, random erasing, repeated augmentation, stochastic "
        "depth, EMA). Defaults are the recipe's (--recipe deit: DeiT's main.py with CaiT's 400 epochs).",
        "train",
    )
    parser.add_argument("--model", default="S24",
                        help="CaiT variant (XXS24, cait_xxs24 or cait_xxs24_224, any case) or a JSON object of "
                             'build_cait arguments, e.g. \'{"embed_dim": 192, "depth": 12, '
                             '"num_heads": 4, "init_values": 1e-5}\'')
    _add_data_arguments(parser, train=True)
    _add_run_arguments(parser, backup_every=1000)
    _add_teacher_argument(parser)
    _add_recipe_arguments(parser, "train", recipe)
    return parser


def finetune_parser(recipe="transfer"):
    parser = _parser(
        "Fine-tune a CaiT on a folder of images: a new head is trained with the backbone "
        "frozen, then the whole network with a lower learning rate (Keras' transfer-learning "
        "recipe), at any resolution (the position embedding is resized).",
        "finetune",
    )
    parser.add_argument("--model", default="XXS24",
                        help="CaiT variant (XXS24, cait_xxs24 or cait_xxs24_224, any case) or the "
                             "path of a .keras model")
    parser.add_argument("--weights", default="imagenet",
                        help="for a variant: imagenet, none, or a weights file")
    _add_data_arguments(parser, train=True, model_file=True)
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="held out for validation when --val-data is not given (0: none)")
    _add_run_arguments(parser, backup_every=200)
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="fine-tune rank-R LoRA updates of the attention projections and the "
                             "head instead of the whole network (0: the whole network); LoRA "
                             "takes a higher --lr, e.g. 1e-3")
    _add_teacher_argument(parser)
    _add_recipe_arguments(parser, "finetune", recipe)
    return parser


def evaluate_parser():
    parser = _parser("Top-1 / top-5 accuracy of a CaiT on a folder of images or a TFDS split.", "evaluate")
    parser.add_argument("--model", default="S24",
                        help="CaiT variant (S24, cait_s24 or cait_s24_224, any case; with --weights) "
                             "or the path of a .keras model")
    parser.add_argument("--weights", default="imagenet",
                        help="for a variant: imagenet or a weights file")
    _add_data_arguments(parser, train=False, model_file=True)
    parser.add_argument("--batch-size", type=int, default=64, help="evaluation batch size")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32", help="dtype policy")
    return parser


def _configure(args):
    keras.utils.set_random_seed(args.seed)
    if getattr(args, "deterministic", False):
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(args.precision)


# === Checks made before any data are read or model built ===


def check_arguments(command, args):
    """Refuses flags that cannot work, alone or together, and outputs that cannot be written
    (a `usage` or `fail` error naming the flag), before the run reads data or builds a model."""
    check_range("--batch-size", args.batch_size, 1, example=64)
    check_range("--crop-pct", args.crop_pct, 0.01, 1.0, example=1.0)
    _check_model(args)
    _check_image_size(args)
    for flag in ("--data", "--val-data"):
        _check_data(flag, getattr(args, flag[2:].replace("-", "_"), None), args.class_names)
    if args.class_names and not os.path.isfile(args.class_names):
        raise fail(f"--class-names {args.class_names}: no such file; give a text file with one "
                   "class name per line.")
    if command == "evaluate":
        return
    check_range("--epochs", args.epochs, 1 if command == "train" else 0, example=10)
    check_range("--backup-every", args.backup_every, 1, example=1000)
    check_range("--shuffle-buffer", args.shuffle_buffer, 1, example=10000)
    for field in dataclasses.fields(recipes.Recipe):
        value = getattr(args, field.name, None)
        problem = recipes.out_of_range(field, value,
                                       example=getattr(recipes.RECIPES[args.recipe], field.name) or None)
        if problem:
            raise usage(f"{recipes.flag(field.name)} {recipes.shown(value)}: {problem}.")
    _check_distillation_flags(args)
    if command == "finetune":
        check_range("--val-fraction", args.val_fraction, 0.0, 0.99, example=0.1)
        check_range("--lora-rank", args.lora_rank, 0, example=8)
        if args.epochs == 0 and args.head_epochs == 0:
            raise usage("--epochs 0 and --head-epochs 0: nothing to train; give --epochs or "
                        "--head-epochs of at least 1.")
    if args.epochs and not 0 <= args.warmup_epochs < args.epochs:
        raise usage(f"--warmup-epochs {args.warmup_epochs:g} with --epochs {args.epochs}: the "
                    f"warmup must be shorter than the run; give --epochs {int(args.warmup_epochs) + 1} "
                    "or more, or a shorter --warmup-epochs.")
    check_writable_folder("--output-dir", args.output_dir)


def _check_model(args):
    """train builds a variant or a JSON architecture; finetune and evaluate take a variant or a
    .keras model (they have --weights)."""
    saved_models = "weights" in args
    if args.model.lstrip().startswith("{") and not saved_models:
        try:
            arguments = json.loads(args.model)
        except json.JSONDecodeError as error:
            raise usage(f"--model {args.model}: not valid JSON ({error}); e.g. "
                        '\'{"embed_dim": 192, "depth": 12, "num_heads": 4}\'.') from error
        if not isinstance(arguments, dict):
            raise usage(f"--model {args.model}: a JSON object of build_cait arguments is expected.")
    elif args.model.endswith(".keras") and saved_models:
        if not os.path.isfile(args.model):
            raise fail(f"--model {args.model!r}: no such file (a .keras model or a CaiT variant).")
    else:
        try:
            parse_model_name(args.model)
        except ValueError as error:
            other = "the path of a .keras model" if saved_models else "a JSON object of build_cait arguments"
            raise usage(f"--model: {error} Or {other}.") from error


def _patch_size(args):
    """The patch size of the model to build, or None when a .keras model decides."""
    if args.model.endswith(".keras"):
        return None
    if args.model.lstrip().startswith("{"):
        return json.loads(args.model).get("patch_size", 16)
    return 16


def _check_image_size(args):
    if args.image_size is None:
        return
    patch = _patch_size(args)
    if args.image_size < 1 or (patch and args.image_size % patch):
        nearest = max(patch or 1, round(args.image_size / (patch or 1)) * (patch or 1))
        raise usage(f"--image-size {args.image_size}: must be a positive multiple of the patch "
                    f"size {patch or 1}, e.g. --image-size {nearest}.")


def _check_data(flag, spec, class_names):
    if spec is None or spec.startswith("tfds:"):
        return
    if spec.startswith("tfrecord:"):
        if not class_names:
            raise usage(f"{flag} {spec}: TFRecords need the class names; add --class-names FILE "
                        "(one name per line).")
        return
    if not os.path.isdir(spec):
        what = "is a file" if os.path.exists(spec) else "no such folder"
        raise fail(f"{flag} {spec}: {what}; give a folder of class subfolders (e.g. "
                   f"{os.path.join(spec, 'cat', '1.jpg')}), tfrecord:PATTERN or tfds:NAME:SPLIT.")


def _check_distillation_flags(args):
    if args.distillation_type == "none" and args.teacher:
        raise usage(f"--teacher {args.teacher} is given but --distillation-type is none; add "
                    "--distillation-type hard (the paper's) or soft.")
    if args.distillation_type != "none" and not args.teacher:
        raise usage(f"--distillation-type {args.distillation_type} needs a teacher: --teacher "
                    "PATH.keras or a keras.applications name, e.g. RegNetY160.")
    if args.teacher and args.teacher.endswith(".keras") and not os.path.isfile(args.teacher):
        raise fail(f"--teacher {args.teacher}: no such file; give a .keras model or a "
                   "keras.applications name, e.g. RegNetY160.")


def _check_batch(args, train, global_batch):
    """The batch fits the data: checked once the data are listed, before a model is built."""
    if global_batch > train.num_examples:
        raise usage(f"--batch-size {args.batch_size} (global batch {global_batch}) is larger than "
                    f"the {train.num_examples} training images of --data {args.data}; give "
                    f"--batch-size {max(1, train.num_examples // max(1, global_batch // args.batch_size))} "
                    "or less, or more images.")


def _class_names(args):
    if not args.class_names:
        return None
    with open(args.class_names) as file:
        return [line.strip() for line in file if line.strip()]


def _sources(args):
    class_names = _class_names(args)
    with user_input(f"--data {args.data}", ValueError, ImportError, FileNotFoundError):
        train = sources.source(args.data, class_names, args.tfds_dir)
    if args.val_data:
        with user_input(f"--val-data {args.val_data}", ValueError, ImportError, FileNotFoundError):
            return train, sources.source(args.val_data, class_names, args.tfds_dir)
    if getattr(args, "val_fraction", 0):
        with user_input(f"--val-fraction {args.val_fraction}", ValueError):
            return sources.split(train, args.val_fraction, seed=args.seed)
    return train, None


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


def _compile(model, args, recipe, global_batch, steps, head=False):
    """`model` compiled with the recipe's AdamW and schedule (the head stage's with `head`)."""
    model.compile(
        optimizer=recipe.optimizer(model, global_batch, steps, head=head),
        # Weighted: rows of sample weight 0 fill up a last, partial batch across hosts (distribute).
        loss=keras.losses.CategoricalCrossentropy(reduction="mean_with_sample_weight"),
        weighted_metrics=_metrics(getattr(model, "student", model).output_shape[-1]),
        jit_compile="auto" if args.jit_compile else False,
    )


def _teacher(args, num_classes):
    """The frozen teacher of `--teacher`, or None without distillation."""
    _check_distillation_flags(args)
    if args.distillation_type == "none":
        return None
    if args.teacher.endswith(".keras"):
        teacher = load_keras_model(args.teacher)
    elif hasattr(keras.applications, args.teacher):
        teacher = getattr(keras.applications, args.teacher)(weights="imagenet")
    else:
        raise fail(f"--teacher {args.teacher}: neither a .keras file nor a "
                   "keras.applications model; e.g. RegNetY160 or teacher.keras.")
    if teacher.output_shape[-1] != num_classes:
        raise fail(f"--teacher {args.teacher} predicts {teacher.output_shape[-1]} "
                   f"classes but the data has {num_classes}; give a teacher "
                   "trained on the same classes.")
    return teacher


def _fitted(model, recipe, teacher):
    """What `fit` trains: the model, or a `Distiller` of it from the teacher."""
    if teacher is None:
        return model
    # A softmax head gives probabilities; anything else is taken as logits.
    softmax = getattr(teacher.layers[-1], "activation", None) is keras.activations.softmax
    return Distiller(model, teacher, recipe.distillation_type, recipe.distillation_alpha,
                     recipe.distillation_tau, teacher_from_logits=not softmax)


def _data_plan(args, train):
    """What a rerun in the same --output-dir must share with the run it resumes, besides the schedule."""
    data = args.data if ":" in args.data else os.path.abspath(args.data)  # tfrecord:, tfds: as given
    return {"data": data, "classes": train.num_classes, "image size": args.image_size}


def _train(model, args, recipe, train, validation, distribution, epochs, output_dir, backup_name, seed):
    """One resumable `fit` of `epochs` epochs; returns its History (None if already done)."""
    global_batch = distribution.global_batch_size(recipe.batch_size)
    steps = stream.steps_per_epoch(train, global_batch)
    with user_input(None, ImportError):  # TensorBoard, an extra
        callbacks, backup = run_callbacks(
            output_dir,
            os.path.join(output_dir, "backup", backup_name),
            args.backup_every,
            monitor="val_accuracy" if validation else "loss",
            stage=backup_name,
        )
    augmentation = recipe.augmentation(args.image_size, train.num_classes)

    def stream_from(step):
        return stream.training_stream(
            train, augmentation, global_batch, epochs, seed=seed, start_step=step,
            shuffle_buffer=args.shuffle_buffer, cache=args.cache,
        )

    validation_flag = f"--val-data {args.val_data}" if args.val_data else f"--data {args.data}"
    with user_input(None, resume.BackupError), named_bad_images(  # a damaged backup; bad images
            f"--data {args.data}", train, (validation_flag, lambda: _sources(args)[1])):
        history = resume.fit(
            model, stream_from, epochs, steps, backup=backup, callbacks=callbacks,
            validation_data=validation, verbose=args.verbose,
            plan={**_data_plan(args, train), "global batch size": global_batch},
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


def _new_model(args, recipe, classes):
    shape = dict(input_shape=(args.image_size, args.image_size, 3), classes=classes,
                 drop_path_rate=recipe.drop_path)
    if args.model.lstrip().startswith("{"):
        with user_input(f"--model {args.model}", ValueError, TypeError):
            return build_cait(**json.loads(args.model), **shape)
    return cait(args.model, weights=None, **shape)


def _distribution(args):
    with user_input(f"--strategy {args.strategy}", ValueError):
        return distribute.distribution(args.strategy)


def _announce(distribution, recipe, global_batch, steps, peak):
    print(
        f"{distribution.name}: {distribution.replicas} replica(s), global batch {global_batch} "
        f"({recipe.batch_size} per replica), {steps} steps per epoch, peak learning rate {peak:.3g}",
        flush=True,
    )


# Flags that change how a run goes, not what it trains: a rerun may change them.
_NOT_SETTINGS = ("run", "debug", "verbose", "output_dir", "backup_every", "cache", "jit_compile",
                 "deterministic", "strategy", "recipe")


def _settings(args, train, global_batch):
    """What a rerun in the same --output-dir must share with the run it resumes or repeats, besides
    the recipe (recipe.json): the data, the model, the precision, the seed and the global batch."""
    settings = {}
    for name, value in sorted(vars(args).items()):
        if name in _NOT_SETTINGS or name in recipes.knobs():
            continue
        if name in ("data", "val_data", "model", "teacher", "class_names") and value and ":" not in value \
                and os.path.exists(value):
            value = os.path.abspath(value)
        settings["--" + name.replace("_", "-")] = value
    return {**settings, "classes": list(train.class_names), "global batch size": global_batch}


def _run_record(command, args, recipe, train, global_batch, output_dir):
    """run.json and recipe.json of the run in `output_dir`: a rerun with another setting or knob is
    refused, naming it."""
    with user_input(None, resume.BackupError):
        return resume.RunRecord.open(output_dir, command, _settings(args, train, global_batch),
                                     recipe=recipe, recipe_name=args.recipe)


def _finished_earlier(output_dir):
    """A rerun of a run that finished: nothing is trained and nothing is written."""
    print(f"{output_dir} holds this run, finished earlier with the same settings: nothing to train. "
          "Give another --output-dir (or delete this one) to train again.", flush=True)
    _summary(output_dir)
    return load_keras_model(os.path.join(output_dir, "final.keras"))


def _summary(output_dir):
    """Where the files went, the best validation accuracy, and what to run next."""
    import shlex

    from keras_cait.training.callbacks import best_record_path

    files = {
        "best.keras": "the model of the best epoch (below)",
        "final.keras": "the model at the end",
        "ema.keras": "the moving average of the weights",
        "head.weights.h5": "the model after its head-only stage",
        "recipe.json": "the training recipe of the run, every knob (Recipe.load reads it)",
        "run.json": "the other settings of the run and the stages it finished",
        "logs": "TensorBoard logs (tensorboard --logdir " + shlex.quote(os.path.join(output_dir, "logs")) + ")",
    }
    print(f"\nDone. In {output_dir}:")
    for name, what in files.items():
        if os.path.exists(os.path.join(output_dir, name)):
            print(f"  {name:<16} {what}")
    best_path = os.path.join(output_dir, "best.keras")
    with contextlib.suppress(OSError, ValueError, KeyError):
        with open(best_record_path(best_path)) as file:
            best = json.load(file)
        stage = {"head": " of the head-only stage", "full": " of the whole-network stage",
                 "lora": " of the LoRA stage"}.get(best.get("stage"), "")
        name = {"val_accuracy": "validation accuracy", "loss": "training loss (no validation data)"}.get(
            best["monitor"], best["monitor"])
        value = f"{best['value']:.2%}" if best["monitor"].endswith("accuracy") else f"{best['value']:.4g}"
        print(f"Best {name}: {value} at epoch {best['epoch']}{stage} (best.keras).")
    model = shlex.quote(best_path)
    serving = shlex.quote(os.path.join("serving", os.path.basename(os.path.abspath(output_dir)), "1"))
    print("Next:")
    print(f"  keras-cait predict IMAGE... --model {model}")
    print(f"  keras-cait evaluate --model {model} --data TEST_FOLDER")
    print(f"  keras-cait export {serving} --model {model}    (TF Serving; or a .onnx, .tflite, .xml file)",
          flush=True)


def train_run(args):
    """Trains `args.model` from scratch; writes best.keras, final.keras (and ema.keras)."""
    recipe = recipe_of(args)
    _configure(args)
    distribution = _distribution(args)
    train, validation = _sources(args)
    global_batch = distribution.global_batch_size(recipe.batch_size)
    _check_batch(args, train, global_batch)
    steps = stream.steps_per_epoch(train, global_batch)
    output_dir = _output_dir(args, distribution)
    record = _run_record("train", args, recipe, train, global_batch, output_dir)
    if record.finished("train"):
        return _finished_earlier(output_dir)
    with distribution.scope():
        model = with_class_names(_new_model(args, recipe, train.num_classes), train.class_names)
        fitted = _fitted(model, recipe, _teacher(args, train.num_classes))
        _compile(fitted, args, recipe, global_batch, steps)
    _announce(distribution, recipe, global_batch, steps, recipe.peak_lr(global_batch))
    _train(fitted, args, recipe, train, _validation(args, validation, global_batch), distribution,
           recipe.epochs, output_dir, "train", args.seed)
    save_model(model, os.path.join(output_dir, "final.keras"))
    record.finish("train")
    if distribution.is_chief:
        _summary(output_dir)
    return model


def _classifier(args, recipe, class_names):
    """The model to fine-tune, named `class_names`: the loaded one with its own head when it
    predicts that many classes and the recipe keeps heads (deit-highres, as DeiT's --finetune),
    else a new head."""
    keep_head = recipe.keep_head
    backbone = _load_backbone(args, recipe, keep_head)
    if keep_head and backbone.output_shape[-1] == len(class_names) and transfer.HEAD_NAME in [
        layer.name for layer in backbone.layers
    ]:
        return with_class_names(backbone, class_names)  # a .keras file may hold a plain keras.Model
    return transfer.with_new_head(backbone, len(class_names), name="cait_finetuned",
                                  class_names=class_names)


def _load_backbone(args, recipe, keep_head=False):
    """A CaiT at `args.image_size`: a variant with its weights, or a .keras model; without
    its head unless `keep_head`."""
    if args.model.endswith(".keras"):
        # The file keeps the dtype policy it was saved with; --precision decides.
        model = transfer.with_dtype_policy(load_keras_model(args.model), args.precision)
        if args.image_size is None:
            args.image_size = _square_side(model)
        if model.input_shape[1:3] != (args.image_size, args.image_size):
            model = transfer.at_resolution(model, args.image_size)
        return model
    args.image_size = args.image_size or _named_resolution(args.model)
    weights = None if args.weights.lower() == "none" else args.weights
    with weights_errors(weights):
        head = dict(include_top=True) if keep_head else dict(include_top=False, pooling="token")
        return cait(
            args.model, **head, weights=weights,
            input_shape=(args.image_size, args.image_size, 3), drop_path_rate=recipe.drop_path,
        )


def _named_resolution(model_name):
    """The input side of a CaiT by name (`keras_cait.variants.default_image_size`)."""
    from keras_cait.variants import default_image_size

    return default_image_size(model_name)


def _square_side(model):
    height, width = model.input_shape[1:3]
    if height != width:
        raise fail(f"--model takes {height}x{width} images; give --image-size for a "
                            "square size to run it at.")
    return height


def _check_lora_can_start(output_dir):
    """A LoRA stage cannot resume: Keras saves LoRA merged into the kernel and zeroes A and B on loading."""
    backup = os.path.join(output_dir, "backup", "lora")
    if os.path.exists(backup):
        raise fail(
            f"{backup} holds a backup of an interrupted LoRA stage, which cannot be resumed (Keras "
            "saves the LoRA update merged into the kernel, and A = B = 0 would not train); "
            f"remove {backup} to run the LoRA stage again from the trained head."
        )


def finetune_run(args):
    """Fine-tunes a CaiT; writes head.weights.h5, best.keras, final.keras (and ema.keras)."""
    recipe = recipe_of(args)
    _configure(args)
    distribution = _distribution(args)
    train, validation = _sources(args)
    global_batch = distribution.global_batch_size(recipe.batch_size)
    _check_batch(args, train, global_batch)
    steps = stream.steps_per_epoch(train, global_batch)
    output_dir = _output_dir(args, distribution)
    head_weights = os.path.join(output_dir, "head.weights.h5")
    record = _run_record("finetune", args, recipe, train, global_batch, output_dir)
    last_stage = ("lora" if args.lora_rank else "full") if recipe.epochs else "head"
    if record.finished(last_stage):
        return _finished_earlier(output_dir)

    with distribution.scope():
        model = _classifier(args, recipe, train.class_names)
        teacher = _teacher(args, train.num_classes)
    validation = _validation(args, validation, global_batch)  # at the backbone's size
    _announce(distribution, recipe, global_batch, steps, recipe.peak_lr(global_batch))
    if recipe.head_epochs:
        print(f"Stage 1 of 2: the new head alone, backbone frozen, {recipe.head_epochs} epoch(s)",
              flush=True)
        if record.finished("head") and os.path.exists(head_weights):
            print(f"Stage 1 done in an earlier run: the head is loaded from {head_weights}, not "
                  "trained again.", flush=True)
            model.load_weights(head_weights)
        else:
            transfer.set_backbone_trainable(model, False)
            with distribution.scope():
                _compile(model, args, recipe, global_batch, steps, head=True)
            _train(model, args, recipe, train, validation, distribution, recipe.head_epochs,
                   output_dir, "head", args.seed)
            model.optimizer = None
            with written_atomically(head_weights) as partial:
                model.save_weights(partial)
        record.finish("head")
    if recipe.epochs:
        stage = (f"LoRA of rank {args.lora_rank} on the attention projections, and the head"
                 if args.lora_rank else "the whole network")
        print(f"Stage 2 of 2: {stage}, {recipe.epochs} epoch(s)", flush=True)
        with distribution.scope():
            if args.lora_rank:
                _check_lora_can_start(output_dir)
                lora.enable_lora(model, args.lora_rank)
            else:
                transfer.set_backbone_trainable(model, True)
            fitted = _fitted(model, recipe, teacher)
            _compile(fitted, args, recipe, global_batch, steps)
        _train(fitted, args, recipe, train, validation, distribution, recipe.epochs,
               output_dir, last_stage, args.seed + 1)
    if args.lora_rank:
        model = lora.merge_lora(model)
    save_model(model, os.path.join(output_dir, "final.keras"))
    record.finish(last_stage)
    if distribution.is_chief:
        _summary(output_dir)
    return model


def evaluate_run(args):
    """Prints and returns {"top1": ..., "top5": ..., "images": ...} of the model on the data."""
    keras.mixed_precision.set_global_policy(args.precision)
    with user_input(f"--data {args.data}", ValueError, ImportError, FileNotFoundError):
        source = sources.source(args.data, _class_names(args), args.tfds_dir)
    if args.model.endswith(".keras"):
        model = load_keras_model(args.model)
        if args.image_size is None:
            args.image_size = _square_side(model)
        elif model.input_shape[1:3] != (args.image_size, args.image_size):
            raise fail(f"--image-size {args.image_size}: the model takes "
                                   f"{model.input_shape[1]}x{model.input_shape[2]} images; "
                                   "leave --image-size out to use the model's size.")
    else:
        args.image_size = args.image_size or _named_resolution(args.model)
        weights = None if args.weights.lower() == "none" else args.weights
        with weights_errors(weights):
            model = cait(args.model, weights=weights,
                         input_shape=(args.image_size, args.image_size, 3))
    classes = model.output_shape[-1]
    if classes != source.num_classes:
        raise fail(
            f"--model {args.model} predicts {classes} classes but --data {args.data} has "
            f"{source.num_classes}; evaluate on data with the model's classes in the same "
            "(sorted) order."
        )
    names = getattr(model, "class_names", None)
    if names is not None and list(names) != [str(name) for name in source.class_names]:
        raise fail(
            f"--data {args.data} has the classes {_listed(source.class_names)} but --model "
            f"{args.model} was trained on {_listed(names)}; evaluate on data of the model's "
            "classes (folder names are classes, in sorted order)."
        )
    metrics = [keras.metrics.SparseTopKCategoricalAccuracy(1, name="top1")]
    if classes >= 5:
        metrics.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5"))
    # Keras evaluates a loss in any case; only the accuracies are reported.
    model.compile(loss="sparse_categorical_crossentropy", metrics=metrics, jit_compile=False)
    dataset = stream.evaluation_dataset(source, args.image_size, args.batch_size, args.crop_pct)
    with named_bad_images(f"--data {args.data}", source):
        results = model.evaluate(dataset, return_dict=True, verbose=1)
    report = {name: float(value) for name, value in results.items() if name != "loss"}
    report["images"] = source.num_examples
    print(json.dumps(report))
    return report


def _listed(names):
    names = [str(name) for name in names]
    return ", ".join(names) if len(names) <= 6 else f"{', '.join(names[:5])}, … ({len(names)} in all)"


COMMANDS = {
    "train": (train_parser, train_run),
    "finetune": (finetune_parser, finetune_run),
    "evaluate": (evaluate_parser, evaluate_run),
}


def main(command, argv=None):
    """Parses `argv` with the command's parser, checks and runs it, e.g. `main("evaluate", [...])`;
    a user's mistake raises `CommandFailed` (a SystemExit) after its one line."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    with reported(command, argv):
        args = parse_arguments(command, argv)
        check_arguments(command, args)
        COMMANDS[command][1](args)


def parse_arguments(command, argv):
    """`argv` parsed by the command's parser; for train and finetune built with the defaults of the
    `--recipe` that `argv` names, so that every flag typed wins over the recipe."""
    parser = COMMANDS[command][0]
    if command in DEFAULT_RECIPES:
        return parser(_recipe_named(argv, command)).parse_args(argv)
    return parser().parse_args(argv)
