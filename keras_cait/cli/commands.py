"""The `keras-cait` command line: predict, convert, export, attention, demo, train, finetune, evaluate.

Each command's work is a function of its parsed arguments; models are built
inside it, after the arguments, input files and output folders are checked, so a
mistake is reported before anything is built or downloaded. Every command keeps
the error contract of `keras_cait.cli.errors` (one line, status 2 or 1).
`train`, `finetune` and `evaluate` have many flags of their own and are parsed
by `keras_cait.cli.runs`.
"""

import os
import sys

from keras_cait.cli.errors import (
    Parser,
    add_debug_flag,
    check_image_files,
    check_range,
    check_writable_file,
    check_writable_folder,
    fail,
    read_class_names,
    reported,
    usage,
    user_input,
    weights_errors,
    writing,
)
from keras_cait.export.formats import (
    CALIBRATION_SIZE,
    FORMATS,
    compute_dtypes,
    file_formats,
    folder_format,
    format_of,
    listed,
    quantization_modes,
)
from keras_cait.models.variants import IMAGENET_CLASSES, default_image_size, parse_model_name
from keras_cait.weights import WEIGHT_FILES


def _variant_of(model_name):
    """'cait_s24_224' -> ('S24', 224); 'cait_xs36' or 'XS36' -> ('XS36', None)."""
    try:
        return parse_model_name(model_name)
    except ValueError as error:
        raise usage(error) from error


def _side(model_name):
    """The input side of a CaiT by name (`keras_cait.models.default_image_size`)."""
    _variant_of(model_name)
    return default_image_size(model_name)


def _loaded(model, weights, flag="--weights", **options):
    """`keras_cait.models.load_classifier(model, weights=..., **options)`, its errors as the line
    (naming `flag`, the words that gave `weights`): the one loader of every command (`--weights`
    left out is "imagenet")."""
    from keras_cait.models import load_classifier

    with weights_errors(weights, flag=flag):
        return load_classifier(model, weights="imagenet" if weights is None else weights, **options)


def _check_model_argument(args, top_flag=None):
    """A `.keras` file or a CaiT name, checked before anything is read or built; for a name, also
    the --top / --top-k flag `top_flag` against its 1000 ImageNet classes."""
    if args.model.endswith(".keras"):
        if args.weights is not None:
            raise usage(f"--weights {args.weights} applies to a CaiT name; --model {args.model} "
                        "holds its own weights. Leave --weights out.")
        return
    _variant_of(args.model)
    if top_flag:
        check_range(top_flag, getattr(args, top_flag[2:].replace("-", "_")), 1, IMAGENET_CLASSES, example=5)


def _model(args):
    """The CaiT classifier of `--model`: a saved `.keras` model (e.g. best.keras of a fine-tuning
    run) or a CaiT by name (cait_s24_224) with `--weights`, at its own side."""
    return _loaded(args.model, args.weights)


def _square_side(model, model_name):
    """The input side of a model that takes square images (images are centre-cropped square)."""
    from keras_cait.models import image_side

    with user_input(None, ValueError):
        return image_side(model, value=model_name)


def _classes(model, model_name):
    """The class count of a classifier (`keras_cait.models.class_names.class_count`); a model without class
    scores is refused."""
    from keras_cait.models.class_names import class_count

    try:
        return class_count(model)
    except ValueError as error:
        raise fail(f"--model {model_name!r}: {error}") from error


def _load_image(path, side):
    import tensorflow as tf

    from keras_cait.preprocessing import load_image

    try:
        return load_image(path, side)
    except (OSError, ValueError) as error:
        raise fail(error) from error
    except tf.errors.OpError as error:  # a file system of TensorFlow's (gs://, ...)
        raise fail(f"image {path!r}: {error.message}; check the path and its permissions, or "
                   "download the image and give its local path.") from error


def predict(args):
    import numpy as np

    from keras_cait.models.class_names import class_names_of

    _check_model_argument(args, "--top")
    check_range("--top", args.top, 1, example=5)
    check_range("--batch-size", args.batch_size, 1, example=32)
    # The images first: a typo in a path or a bad file should not wait for (or download) a
    # model. A .keras file is local and says the size to read them at.
    check_image_files(args.images)
    saved = args.model.endswith(".keras")
    model = _model(args) if saved else None
    side = _square_side(model, args.model) if saved else _side(args.model)
    images = np.stack([_load_image(path, side) for path in args.images])
    model = model or _model(args)
    classes = _classes(model, args.model)
    check_range("--top", args.top, 1, classes, example=min(5, classes))
    top = args.top or min(5, classes)
    probabilities = np.asarray(model.predict(images, batch_size=args.batch_size, verbose=0), "float32")
    names = class_names_of(model, wordnet_ids=True) or [f"class {index}" for index in range(classes)]
    for path, scores in zip(args.images, probabilities):
        print(path)
        for index in np.argsort(-scores, kind="stable")[:top]:
            print(f"  {scores[index]:7.2%}  {names[index]}")


def convert(args):
    variant, resolution = _variant_of(args.model)
    if resolution is None:
        raise usage(f"--model {args.model}: give the resolution too, e.g. cait_{variant.lower()}_384.")
    if not args.output.endswith(".weights.h5"):
        raise usage(f"--output {args.output!r} must end in .weights.h5, e.g. {args.model}.weights.h5.")
    checkpoints = f"{', '.join(WEIGHT_FILES[:-2])} or {WEIGHT_FILES[-2]}"  # not keras_cait's own .weights.h5
    if not os.path.isfile(args.checkpoint):
        what = "is a folder" if os.path.isdir(args.checkpoint) else "no such file"
        raise fail(f"checkpoint {args.checkpoint!r}: {what}; give a {checkpoints} file.")
    if not args.checkpoint.endswith(WEIGHT_FILES[:-1]):
        raise usage(f"checkpoint {args.checkpoint!r}: not a timm or DeiT checkpoint; give a {checkpoints} file.")
    check_writable_file("--output", args.output)
    model = _loaded(args.model, args.checkpoint, flag="checkpoint")
    from keras_cait.io.atomic import written_atomically

    with writing(args.output), written_atomically(args.output) as partial:
        model.save_weights(partial)
    print(f"wrote {args.output} ({model.count_params():,} parameters)")


def export(args):
    from keras_cait import export as exporters

    output = args.output.rstrip("/")
    is_file = format_of(output).suffix is not None
    for flag, value in (("--top-k", args.top_k), ("--class-names", args.class_names)):
        if value is not None and is_file:
            folder = folder_format().name
            raise usage(
                f"{flag} applies to {folder}s only ({listed(row.name for row in file_formats())} output "
                f"scores); leave it out, or export a {folder} version folder."
            )
    refused = format_of(output).refused_compute_dtype(args.compute_dtype)
    if refused:
        raise usage(refused)
    if args.jit and is_file:
        raise usage(f"--jit applies to a {folder_format().name} version folder only; the runtimes of "
                    f"{listed(row.name for row in file_formats())} compile the graph themselves. Leave it out, "
                    "or export a version folder.")
    if args.compute_dtype != "float32" and args.quantization:
        raise usage(f"--compute-dtype {args.compute_dtype} with --quantization {args.quantization}: choose one.")
    _check_calibration(output, args)
    _check_model_argument(args, "--top-k")
    check_range("--top-k", args.top_k, 1, example=5)
    if is_file:  # first: a destination the file system refuses is a failure (1), not a usage error (2)
        check_writable_file("output", output)
    else:
        check_writable_folder("output", output, folder=os.path.dirname(os.path.abspath(output)))
    try:
        exporters.check_destination(output, args.overwrite, args.quantization)
    except ValueError as error:
        raise usage(error) from error
    except FileExistsError as error:
        raise fail(error) from error
    names = read_class_names("--class-names", args.class_names) if args.class_names else None
    model = _model(args)
    classes = _classes(model, args.model)
    check_range("--top-k", args.top_k, 1, classes, example=min(5, classes))
    names = None if is_file else _serving_class_names(model, args, names)
    try:
        with writing(output):
            _export(exporters, model, output, args, names)
    except (ValueError, FileExistsError, ImportError) as error:
        raise fail(error) from error
    print(f"wrote {output}")


def _check_calibration(output, args):
    """--calibration-data where the format and --quantization take it (the formats table), and
    a folder holding images: checked before the model is built."""
    row = format_of(output)
    refused = row.refused_calibration(args.quantization, args.calibration_data)
    if refused:
        raise usage(refused)
    if args.calibration_size is not None and args.calibration_data is None:
        raise usage(f"--calibration-size {args.calibration_size} applies with --calibration-data; give that too, "
                    "or leave --calibration-size out.")
    check_range("--calibration-size", args.calibration_size, 1, example=CALIBRATION_SIZE)
    if args.calibration_data is not None:
        from keras_cait.export.openvino import calibration_files

        try:
            calibration_files(args.calibration_data)
        except ValueError as error:
            raise fail(error) from error


def _serving_class_names(model, args, names):
    """The names of a SavedModel's top_k_classes output: --class-names FILE's (`names`), checked
    against the model's classes, else None for the model's own (or ImageNet's); a model that has
    none is refused naming the flag."""
    from keras_cait.models.class_names import checked_class_names, class_names_of

    classes = _classes(model, args.model)
    if names is None:
        if class_names_of(model) is None:
            raise fail(f"--model {args.model} has {classes} classes and no class names of its own, which the "
                       f"SavedModel's top_k_classes output lists; give them: --class-names FILE (one name per "
                       f"line, {classes} lines, in the order of the model's outputs).")
        return None
    if len(names) != classes:
        raise fail(f"--class-names {args.class_names} has {len(names)} names but --model {args.model} has "
                   f"{classes} classes; give one name per line, one per class, in the order of the model's outputs.")
    with user_input(f"--class-names {args.class_names}", ValueError):
        return list(checked_class_names(names, model))


def _export(exporters, model, output, args, class_names=None):
    row = format_of(output)
    options = {"quantization": args.quantization, "overwrite": args.overwrite}
    if args.quantization in row.calibrated:  # NNCF's int8 calibrates on the images of --calibration-data
        options["calibration"] = args.calibration_data
        if args.calibration_size is not None:
            options["calibration_size"] = args.calibration_size
    if row.exporter == "export_openvino" and args.quantization:
        options["verbose"] = True  # NNCF's modes: the line saying what it quantised (and calibration's time)
    if row.suffix is None:  # a SavedModel version folder, whose top_k outputs list the best classes
        options["top_k"] = args.top_k or min(5, _classes(model, args.model))
        options["compute_dtype"] = args.compute_dtype
        options["jit_compile"] = args.jit
        if class_names is not None:
            options["class_names"] = class_names
    getattr(exporters, row.exporter)(model, output, **options)


def _export_help():
    """The help of `keras-cait export`, its OUTPUT and --quantization, from the formats table."""
    files = file_formats()

    def described(mode):
        """`Keras int8 (SavedModel, ONNX), NNCF int8 ..., calibrated (OpenVINO)`: what `mode` is, per format."""
        kinds = {}
        for row in FORMATS:
            if mode in row.quantizations:
                kinds.setdefault(row.describe(mode), []).append(row.name)
        return ", ".join(f"{kind} ({', '.join(names)})" for kind, names in kinds.items())

    modes = "; ".join(f"{mode}: {described(mode)}" for mode in quantization_modes())
    return {
        "command": f"write a {folder_format().name} for TF Serving, or an {' / '.join(r.name for r in files)} file",
        "output": "TF Serving version folder MODEL_BASE_PATH/<n> (e.g. serving/cait/1), or a "
                  + listed((f"{r.suffix} ({r.name})" for r in files), "or") + " file",
        "quantization": modes,
    }


def attention(args):
    from keras_cait.inspection.attention import attention_maps
    from keras_cait.inspection.visualize import class_attention_figure, saliency_figure, save_figure

    if not args.out.endswith(".png"):
        raise usage(f"--out {args.out!r} must end in .png, e.g. maps.png.")
    _check_model_argument(args)
    check_image_files([args.image])
    check_writable_file("--out", args.out)
    model = _model(args)
    side = _square_side(model, args.model)
    images = _load_image(args.image, side)[None]
    with user_input(f"--model {args.model}", ValueError):  # a model without class attention
        maps = attention_maps(model, images)
    saliency_path = args.out.removesuffix(".png") + "_saliency.png"
    with writing(args.out):
        save_figure(class_attention_figure(images, maps), args.out)
    with writing(saliency_path):
        save_figure(saliency_figure(images, maps), saliency_path)
    print(f"wrote {args.out} (every head of both class-attention blocks) and {saliency_path}")


def demo(args):
    from keras_cait.cli import demo as demo_module

    check_range("--epochs", args.epochs, 1, example=3)
    check_writable_folder("--out", args.out)
    with user_input(None, ImportError):
        demo_module.require_extras()
    small = args.small or demo_module.small_from_environment()
    demo_module.run(out=args.out, init=args.init, small=small, epochs=args.epochs)


def build_parser():
    parser = Parser(
        prog="keras-cait", description="CaiT image classification with Keras 3.",
        epilog="A mistake ends a command with one line on standard error, exit status 2 for a "
               "command line that cannot work, 1 for anything else; --debug shows its traceback.",
    )
    add_debug_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("predict", help="print the top classes of images (the model's own, or ImageNet's)")
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--model", default="cait_s24_224", help="a saved .keras model (e.g. runs/ft/best.keras) or cait_<variant>[_<resolution>] "
                        "(default: %(default)s)")
    p.add_argument("--weights", help="for a CaiT name: imagenet, none, or a checkpoint path (default: imagenet)")
    p.add_argument("--top", type=int, help="classes to print (default: 5, or all of fewer)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="images the model takes at once; lower it if memory runs out (default: %(default)s)")
    add_debug_flag(p)
    p.set_defaults(run=predict)

    c = commands.add_parser("convert", help="convert a timm/DeiT checkpoint to Keras .weights.h5")
    c.add_argument("checkpoint", help=".safetensors, .pth or .pt file (timm's or DeiT's)")
    c.add_argument("output", help="the .weights.h5 file to write")
    c.add_argument("--model", required=True, help="cait_<variant>_<resolution>, e.g. cait_s24_384")
    add_debug_flag(c)
    c.set_defaults(run=convert)

    export_help = _export_help()
    e = commands.add_parser("export", help=export_help["command"])
    e.add_argument("output", help=export_help["output"])
    e.add_argument("--model", default="cait_s24_224", help="a saved .keras model (e.g. runs/ft/best.keras) or cait_<variant>[_<resolution>] "
                        "(default: %(default)s)")
    e.add_argument("--weights", help="for a CaiT name: imagenet, none, or a checkpoint path (default: imagenet)")
    e.add_argument("--top-k", type=int, help="SavedModel only: classes in the top_k outputs (default: 5)")
    e.add_argument("--class-names", metavar="FILE",
                   help="SavedModel only: the names of the top_k_classes output, one per line in the order of "
                        "the model's outputs (default: the model's own, e.g. a fine-tuned .keras', or ImageNet's "
                        "for 1000 classes)")
    e.add_argument("--quantization", choices=quantization_modes(), help=export_help["quantization"])
    e.add_argument("--calibration-data", metavar="FOLDER",
                   help=f"{listed(f'{r.name} {m}' for r in FORMATS for m in r.calibrated)} only: images like those "
                        "the model will classify (in FOLDER or its subfolders, e.g. the validation folder), read in "
                        "the model's evaluation transform, to calibrate the int8 scales on")
    e.add_argument("--calibration-size", type=int, metavar="N",
                   help="how many of the --calibration-data images to calibrate on, spread evenly over them "
                        f"(default: {CALIBRATION_SIZE}, NNCF's)")
    e.add_argument("--compute-dtype", choices=compute_dtypes(), default="float32",
                   help="SavedModel only: the dtype of the matmuls; bfloat16 for CPUs with bfloat16 units "
                        "and GPUs, float32 in and out (default: %(default)s)")
    e.add_argument("--jit", action="store_true",
                   help="SavedModel only: compile the model with XLA, faster at small batches on CPUs; TF "
                        "Serving must then run with --xla_cpu_compilation_enabled (without it, every request fails)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing version folder or file")
    add_debug_flag(e)
    e.set_defaults(run=export)

    a = commands.add_parser("attention", help="draw the class-attention maps of an image to PNG files")
    a.add_argument("image", metavar="IMAGE")
    a.add_argument("--out", required=True, help="per-head maps PNG; the saliency overlay goes to OUT_saliency.png")
    a.add_argument("--model", default="cait_s24_224", help="a saved .keras model (e.g. runs/ft/best.keras) or cait_<variant>[_<resolution>] "
                        "(default: %(default)s)")
    a.add_argument("--weights", help="for a CaiT name: imagenet, none, or a checkpoint path (default: imagenet)")
    add_debug_flag(a)
    a.set_defaults(run=attention)

    d = commands.add_parser(
        "demo", help="offline: train a CaiT on digits, export a SavedModel, serve it, draw attention"
    )
    d.add_argument("--out", default="keras_cait_demo", help="output folder (default: %(default)s)")
    d.add_argument("--init", default="auto", choices=("auto", "imagenet", "scratch"),
                   help="start from ImageNet weights or from scratch; auto: ImageNet when cached or "
                        "reachable (default: %(default)s)")
    d.add_argument("--small", action="store_true",
                   help="the quick CI version (also KERAS_CAIT_DEMO_SMALL=1)")
    d.add_argument("--epochs", type=int, help="override the number of epochs")
    add_debug_flag(d)
    d.set_defaults(run=demo)

    for name, help in RUNS.items():
        # Listed here for `keras-cait --help`; main() hands their flags to keras_cait.cli.runs.
        commands.add_parser(name, help=f"{help} (keras-cait {name} --help for the flags)", add_help=False)
    return parser


RUNS = {
    "train": "train a CaiT from scratch with the DeiT/CaiT recipe",
    "finetune": "fine-tune a CaiT on a folder of images",
    "evaluate": "top-1 / top-5 accuracy on a folder of images or a TFDS split",
}


def main(argv=None):
    """`keras-cait ARGV...`; a user's mistake raises `CommandFailed` (a SystemExit) after its line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in RUNS:
        from keras_cait.cli import runs

        runs.main(argv[0], argv[1:])
        return
    command = next((word for word in argv if not word.startswith("-")), None)
    with reported(command if command in COMMANDS else None, argv):
        args, unknown = build_parser().parse_known_args(argv)
        if unknown:  # argparse names them at the top level, where `keras-cait --help` cannot help
            raise usage(f"unrecognized arguments: {' '.join(unknown)}; see keras-cait {command} --help")
        args.run(args)


COMMANDS = ("predict", "convert", "export", "attention", "demo")
