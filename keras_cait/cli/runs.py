"""`keras-cait train | finetune | evaluate`: the flags of `keras_cait.training.run`'s runs.

Each `*_parser()` lists the flags with their defaults and sources; each `*_run(args)`
calls the library's run (`run.train`, `run.finetune`, `run.evaluate`) with the flags'
values, so the command and a Python call are the same run; `check_arguments(command,
args)` refuses what only the command line can get wrong (a flag's syntax, a file a flag
names, an output folder that cannot be written) before any data are read or model built;
`main(command, argv)` parses, checks and runs one, and `_as_flags` turns the library's
errors into the contract's one line, written from their fields (`keras_cait.cli.errors`). From a checkout without
the console script, `python -m keras_cait.cli train | finetune | evaluate` runs the same commands.
"""

import argparse
import dataclasses
import functools
import inspect
import json
import os
import shlex
import sys

from keras_cait.cli.errors import (
    Parser,
    add_debug_flag,
    fail,
    flag,
    flag_name,
    from_library,
    read_class_names,
    reported,
    usage,
    weights_errors,
)
from keras_cait.errors import ArgumentError, lines_kept, speaking
from keras_cait.training import distribute, resume, run
from keras_cait.training import recipe as recipes
from keras_cait.models.variants import parse_model_name
from keras_cait.training.run_models import MODEL_EXAMPLE, TEACHER_EXAMPLE

# Each command's recipe when --recipe is not given.
DEFAULT_RECIPES = {"train": "deit", "finetune": "transfer"}
# Knobs of a fine-tuning run's head stage: `train` has none.
_HEAD_KNOBS = ("head_epochs", "head_lr", "keep_head")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each flag's help ends with its default, unless the help says the default itself (one
    chosen as the command runs: `--verbose`, `--shuffle-buffer`), the flag is required, or it has
    none (None: the flag's help says what leaving it out does)."""

    def _get_help_string(self, action):
        if "(default:" in (action.help or "") or action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


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
                                "--model, else the side of the checkpoint the name loads: 384 for cait_xs24)")
    else:
        group.add_argument("--image-size", type=int, default=224, help="side of the input images")
    group.add_argument("--crop-pct", type=float, default=1.0,
                       help="evaluation centre crop fraction (CaiT: 1.0)")


def _add_run_arguments(parser, backup_every):
    group = parser.add_argument_group("run")
    group.add_argument("--output-dir", required=True,
                       help="best.keras, final.keras, TensorBoard logs/ and backup/ go here; "
                            "rerunning the same command resumes a killed run")
    group.add_argument("--precision", choices=("auto", *run.PRECISIONS), default="auto",
                       help="Keras dtype policy; auto: mixed_float16 on a GPU (DeiT trains with AMP "
                            "float16), mixed_bfloat16 on a CPU with bfloat16 units, else float32")
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
    _add_verbose_argument(group, "train")


# Keras' progress bar redraws itself with carriage returns and colour codes, for a terminal. Into a
# file or a pipe, train and finetune write one line per epoch, and evaluate only its report.
OFF_TERMINAL_VERBOSE = {"train": 2, "finetune": 2, "evaluate": 0}


def progress_verbose(command):
    """The --verbose of `command` ("train", "finetune", "evaluate") when none is given: Keras' bar (1)
    where standard output is a terminal, else `OFF_TERMINAL_VERBOSE`."""
    return 1 if sys.stdout.isatty() else OFF_TERMINAL_VERBOSE[command]


def _add_verbose_argument(parser, command):
    parser.add_argument("--verbose", type=int, default=None, choices=(0, 1, 2),
                        help=f"Keras' progress: 1 a bar, 2 one line per epoch, 0 none (default: 1 on a terminal, "
                             f"{OFF_TERMINAL_VERBOSE[command]} into a file or pipe)")


def _add_teacher_argument(parser):
    parser.add_argument("--teacher",
                        help="the teacher of --distillation-type hard or soft (DeiT's; the paper: a "
                             "RegNetY-16GF teacher, hard distillation): a .keras model file or a "
                             f"keras.applications model name (e.g. {TEACHER_EXAMPLE}, with Keras' ImageNet "
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
        groups[meta["group"]].add_argument(flag(field.name), **options)


def recipe_of(args):
    """The recipe a parsed command line runs: `--recipe`'s, with every knob as the flags say."""
    values = {name: getattr(args, name) for name in recipes.knobs() if hasattr(args, name)}
    return recipes.RECIPES[args.recipe].replace(**values)


class _EarlyParser(argparse.ArgumentParser):
    """A parser that raises its mistakes, printing nothing: `_recipe_named`'s, before the full one."""

    def error(self, message):
        raise argparse.ArgumentError(None, message)


def _recipe_named(argv, command):
    """The `--recipe` of `argv` (the command's default if none or an unknown one, which the full
    parser then refuses), read before the parser is built: its values are the flags' defaults."""
    early = _EarlyParser(add_help=False)
    early.add_argument("--recipe")
    early.add_argument("--model", default="")
    early.add_argument("--weights", default="imagenet")
    try:
        named = early.parse_known_args(argv)[0]
    except argparse.ArgumentError:  # e.g. `--weights` with no value: the full parser's one line says so
        return DEFAULT_RECIPES[command]
    if named.recipe in recipes.RECIPES:
        return named.recipe
    return "scratch" if command == "finetune" and _random_weights(named) else DEFAULT_RECIPES[command]


def _random_weights(args):
    """Whether a finetune command line starts from random weights (`--weights none` for a variant),
    which the `transfer` recipe's learning rate does not train in a short run: `scratch` does."""
    return str(args.weights).lower() == "none" and not args.model.endswith(".keras")


def train_parser(recipe="deit"):
    parser = _parser(
        "Train a CaiT from scratch with the DeiT/CaiT recipe (AdamW, warmup + cosine, "
        "RandAugment, mixup/cutmix, random erasing, repeated augmentation, stochastic "
        "depth, EMA). Defaults are the recipe's (--recipe deit: DeiT's main.py with CaiT's 400 epochs).",
        "train",
    )
    parser.add_argument("--model", default="S24",
                        help="CaiT variant (XXS24, cait_xxs24 or cait_xxs24_224, any case) or a JSON object of "
                             f"build_cait arguments, e.g. {JSON_MODEL_EXAMPLE}")
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
                        help="for a variant: imagenet, none (random weights, trained by --recipe scratch "
                             "unless --recipe is given), or a weights file")
    _add_data_arguments(parser, train=True, model_file=True)
    parser.add_argument("--val-fraction", type=float, default=None,
                        help="the part of --data held out for validation, about as much of each class "
                             "(default: 0.1; 0: none); not with --val-data, whose images validate")
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
    parser.add_argument("--precision", choices=run.PRECISIONS, default="float32", help="dtype policy")
    _add_verbose_argument(parser, "evaluate")
    return parser


# === Checks made before any data are read or model built ===


def check_arguments(command, args):
    """Refuses flags that cannot work, alone or together, and outputs that cannot be written
    (a `usage` or `fail` error naming the flag), before the run reads data or builds a model.
    What the recipe and the run decide themselves (a knob's range, `crop_pct`'s, a count such as
    `backup_every` or `lora_rank`, `val_fraction`'s range, a warmup longer than the run,
    distillation without a teacher) they refuse before they read data too."""
    _check_model(args)
    _check_image_size(args)
    for flag in ("--data", "--val-data"):
        _check_data(flag, getattr(args, flag[2:].replace("-", "_"), None), args.class_names)
    if args.class_names and not os.path.isfile(args.class_names):
        raise fail(f"--class-names {args.class_names}: no such file; give a text file with one "
                   "class name per line.")


# train --model as a JSON object of build_cait's arguments (keras_cait.training.run_models.check_architecture).
JSON_MODEL_EXAMPLE = f"'{json.dumps(MODEL_EXAMPLE)}'"


def _check_model(args):
    """train builds a variant or a JSON architecture; finetune and evaluate take a variant or a
    .keras model (they have --weights)."""
    saved_models = "weights" in args
    if args.model.lstrip().startswith("{") and not saved_models:
        try:
            arguments = json.loads(args.model)
        except json.JSONDecodeError as error:
            raise usage(f"--model {args.model}: not valid JSON ({error}); e.g. {JSON_MODEL_EXAMPLE}.") from error
        if not isinstance(arguments, dict):
            raise usage(f"--model {args.model}: a JSON object of build_cait arguments is expected; e.g. "
                        f"{JSON_MODEL_EXAMPLE}.")
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


def _class_names(args):
    return read_class_names("--class-names", args.class_names) if args.class_names else None


def _arguments(function, args, **given):
    """The keyword arguments of the library's run `function` that the parsed flags give."""
    names = inspect.signature(function).parameters
    values = {name: value for name, value in vars(args).items() if name in names}
    values.update(given, class_names=_class_names(args))
    if values.get("verbose", 0) is None:  # --verbose not given: by where the output goes
        values["verbose"] = progress_verbose(function.__name__)
    if isinstance(values.get("model"), str) and values["model"].lstrip().startswith("{"):
        values["model"] = json.loads(values["model"])
    return values


def _as_flags(run_command):
    """`run_command(args)` with the library's errors as the contract's one line, and the lines it
    says as it works (`keras_cait.errors.say`), in flags: each
    error is written from its fields (`keras_cait.errors.ArgumentError`: `data='photos'` becomes
    `--data photos` by the table `keras_cait.cli.errors.FLAGS`), the values the command turned
    into others (the names of a --class-names FILE, a --model JSON's arguments) as typed."""

    @functools.wraps(run_command)
    def in_flags(args):
        try:
            with speaking(functools.partial(flag_name, typed=_typed(args))), lines_kept():
                return run_command(args)
        except run.RunError as error:
            cause = getattr(error, "cause", None)
            if error.argument == "weights" and isinstance(cause, (OSError, ImportError)):
                with weights_errors(error.value):
                    raise cause from None
            raise from_library(error, _typed(args)) from error
        except (ArgumentError, resume.BackupError) as error:
            raise from_library(error, _typed(args)) from error

    return in_flags


def _typed(args):
    """{argument: (the value the run was given, the words typed)} where the two differ."""
    typed = {"class_names": (_class_names(args), args.class_names)}
    if args.model.lstrip().startswith("{"):
        typed["model"] = (json.loads(args.model), args.model)
    return typed


def parse_arguments(command, argv):
    """`argv` parsed by the command's parser; for train and finetune built with the defaults of the
    `--recipe` that `argv` names, so that every flag typed wins over the recipe."""
    parser = COMMANDS[command][0]
    if command not in DEFAULT_RECIPES:
        return parser().parse_args(argv)
    args = parser(_recipe_named(argv, command)).parse_args(argv)
    # The recipe's batch is lowered to what a small folder fills; a --batch-size typed is kept (or refused).
    args.fit_batch_to_data = not _typed_flag("--batch-size", argv)
    args.recipe_typed = _typed_flag("--recipe", argv)
    return args


def _typed_flag(flag, argv):
    return any(word == flag or word.startswith(flag + "=") for word in argv)


def _next_steps(summary):
    """What to run next on the model a run wrote (`summary`: its `RunResult.summary`)."""
    output_dir = summary["output_dir"]
    model = shlex.quote(os.path.join(output_dir, "best.keras" if "best.keras" in summary["files"] else "final.keras"))
    serving = shlex.quote(os.path.join("serving", os.path.basename(os.path.abspath(output_dir)), "1"))
    print("Next:")
    print(f"  keras-cait predict IMAGE... --model {model}")
    print(f"  keras-cait evaluate --model {model} --data TEST_FOLDER")
    print(f"  keras-cait export {serving} --model {model}    (TF Serving; or a .onnx, .tflite, .xml file)",
          flush=True)


def _trained(result):
    """The model of a `run.train` or `run.finetune` result, the next steps said."""
    _next_steps(result.summary)
    return result.model


@_as_flags
def train_run(args):
    """`keras-cait train`: `keras_cait.training.run.train` with the flags' values; returns the model."""
    return _trained(run.train(**_arguments(run.train, args, recipe=recipe_of(args))))


@_as_flags
def finetune_run(args):
    """`keras-cait finetune`: `keras_cait.training.run.finetune` with the flags' values; returns the model."""
    if args.recipe == "scratch" and _random_weights(args) and not args.recipe_typed:
        run.say_scratch_chosen()
    return _trained(run.finetune(**_arguments(run.finetune, args, recipe=recipe_of(args))))


@_as_flags
def evaluate_run(args):
    """`keras-cait evaluate`: prints and returns {"top1": ..., "top5": ..., "images": ...}."""
    report = run.evaluate(**_arguments(run.evaluate, args)).summary
    print(json.dumps(report))
    return report


COMMANDS = {
    "train": (train_parser, train_run),
    "finetune": (finetune_parser, finetune_run),
    "evaluate": (evaluate_parser, evaluate_run),
}


def main(command, argv=None):
    """Parses `argv` with the command's parser, checks and runs it, e.g. `main("evaluate", [...])`;
    a user's mistake raises `CommandFailed` (a SystemExit) after its one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with reported(command, argv):
        args = parse_arguments(command, argv)
        check_arguments(command, args)
        COMMANDS[command][1](args)
