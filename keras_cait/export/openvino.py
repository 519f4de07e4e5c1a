"""`export_openvino`: OpenVINO IR, the `.xml` graph and its `.bin` weights, float or quantised by NNCF."""

import contextlib
import dataclasses
import logging
import os
import time
import warnings

import numpy as np

from keras_cait import cpu
from keras_cait.errors import ArgumentError, Named, checked_bool, require_extra
from keras_cait.export.core import (
    check_files,
    check_float_model,
    check_quantization,
    float32_copy,
    inference_form,
    loggers_kept,
    require_tensorflow_backend,
    traced,
)
from keras_cait.export.formats import CALIBRATION_SIZE, by_exporter
from keras_cait.export.inference_graph import InferenceGraph
from keras_cait.io.atomic import written_atomically
from keras_cait.models.surgery import check_model_object

FORMAT = by_exporter("export_openvino")
# What stays float in int8 (docs/export.md, "OpenVINO int8 with NNCF"): the roles of `matmul_roles`
# whose inputs NNCF leaves unquantised. The mixes NNCF cannot quantise; the attention matmuls cost
# more to quantise (their (B, H, N, N) inputs) than int8 saves: 1.06-1.16x faster kept float on an
# AMX Xeon, and the same answers on the demo's digits.
KEPT_FLOAT = ("head_mixes", "attention")
# The roles of `matmul_roles` as a sentence names them.
ROLE_NAMES = {"linear": "linear layers", "head": "head", "head_mixes": "talking-heads mixes",
              "attention": "attention matmuls", "after_softmax": "attention·v matmuls"}


@dataclasses.dataclass(frozen=True)
class Quantized:
    """What `export_openvino` quantised: the mode, the matmuls quantised and kept float, and
    for int8 the calibration images and how long NNCF took to calibrate on them."""

    quantization: str
    quantized: int  # int8: the matmuls, convolutions and attentions with int8 inputs; int8_weights: int8 weights
    kept_float: dict  # role -> how many of its ops stayed float
    images: int = 0
    seconds: float = 0.0
    note: str = ""  # what was measured of int8's speed on a CPU of this kind, where something was

    def __str__(self):
        kept = ", ".join(f"the {count} {ROLE_NAMES[role]}" for role, count in self.kept_float.items() if count)
        if self.quantization == "int8_weights":
            line = f"int8_weights: {self.quantized} weight tensors stored as int8 (NNCF, no calibration)"
        else:
            line = (f"int8: {self.quantized} matmuls and convolutions take int8 inputs (NNCF, transformer preset), "
                    f"{kept or 'none'} kept float; calibrated on {self.images} images in {self.seconds:.1f} s")
        return f"{line}. {self.note}" if self.note else line


def export_openvino(model, path, *, quantization=None, calibration=None, calibration_size=CALIBRATION_SIZE,
                    overwrite=False, verbose=False):
    """Writes `model` as OpenVINO IR: float32, or int8 through OpenVINO's NNCF.

    `path` (`.xml`, the graph) and the weights beside it (the same name with
    `.bin`); input `images` `(batch, H, W, 3)` float32 RGB 0..255, one output
    (`predictions` for a CaiT classifier): what the model outputs. A float32
    CaiT classifier is written as its folded inference graph
    (`keras_cait.export.inference_graph`), any other model as Keras exports it.
    Needs `pip install "keras-cait[openvino]"` (OpenVINO and NNCF).

    Args:
        model: the Keras model; for `quantization`, a CaiT classifier as
            `build_cait` makes it (a fine-tuned `.keras` is one).
        path: the `.xml` file to write.
        quantization: None (float32); "int8": NNCF's post-training quantisation
            (`nncf.quantize`, transformer preset): int8 weights and int8 matmul
            inputs, their scales calibrated on `calibration`; "int8_weights":
            NNCF's weight compression (`nncf.compress_weights`): int8 weights,
            float activations, no calibration.
        calibration: for "int8": a folder of images like those the model will
            classify (JPEG, PNG, GIF, BMP or WebP, in it or its subfolders; a
            training or validation folder will do), read in the model's own
            evaluation transform (`keras_cait.preprocessing.load_image`); or an
            array `(N, H, W, 3)` of 0..255 images already in that transform.
        calibration_size: how many of them NNCF calibrates on, spread evenly
            over the folder's sorted files (default 300, NNCF's own).
        overwrite: replace an existing file.
        verbose: print what was quantised and how long calibration took.

    OpenVINO's CPU plugin computes the float parts in bfloat16 where the CPU has
    it (AVX512-BF16, AMX) unless the model is compiled with
    `{"INFERENCE_PRECISION_HINT": "f32"}`; docs/export.md gives the difference to
    Keras for both, and the accuracy of int8.

    Example:
        export_openvino(model, "cait.xml")
        export_openvino(model, "cait_int8.xml", quantization="int8", calibration="data/val")
        compiled = openvino.Core().compile_model("cait.xml", "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        probabilities = compiled(images)[0]
    """
    require_tensorflow_backend("export_openvino")
    check_model_object(model, "export_openvino", inputs=True)
    check_files(FORMAT, path, overwrite)
    weights_path, = FORMAT.companion_paths(path)
    check_quantization(path, quantization)
    check_float_model(model, FORMAT, quantization)
    refused = FORMAT.refused_calibration(quantization, calibration)
    if refused:
        raise refused
    check_calibration_size(calibration_size)  # in every mode: 0 was taken where no calibration runs
    verbose = checked_bool("verbose", verbose, "True (say what was quantised) or False")  # 'no' printed
    if quantization in FORMAT.calibrated:
        calibration = calibration_source(calibration)
    openvino = require_extra(FORMAT.exporter, FORMAT.extra, "openvino")
    if quantization:
        with _quiet():  # nncf imports torch, where it is installed, which probes for CUDA
            require_extra(FORMAT.exporter, FORMAT.extra, "nncf")

    forward = inference_form(model, runtime="openvino")
    if quantization and not isinstance(forward, InferenceGraph):
        raise ArgumentError(
            "model", None, [Named("quantization", quantization),
                            " takes a CaiT classifier as build_cait makes it (its patch embedding, attention blocks "
                            "and head; not headless, LoRA or already quantised)"],
            "export this model in float, or merge and rebuild it as a CaiT first", usage=True,
            shown=f"<{model.name}>")
    if quantization in FORMAT.calibrated:
        images = calibration_images(calibration, model, calibration_size)
    # OpenVINO writes the weights beside the graph, under the `.bin` name; they go into place first.
    with written_atomically(path, overwrite, companions=[weights_path]) as temporary, loggers_kept():
        if isinstance(forward, InferenceGraph):
            converted = openvino.convert_model(traced(forward, model))
            (inputs,), (predictions,) = converted.inputs, converted.outputs
            inputs.get_node().set_friendly_name("images")
            inputs.get_tensor().set_names({"images"})
            predictions.get_tensor().set_names({"predictions"})
            if quantization == "int8":
                converted, done = quantize_int8(converted, images)
                done = dataclasses.replace(done, note=int8_note())
            elif quantization == "int8_weights":
                converted, done = compress_weights_int8(converted)
            openvino.save_model(converted, temporary, compress_to_fp16=False)
        else:
            float32_copy(model).export(temporary, format="openvino", verbose=False)
    if verbose and quantization:
        print(done)
    return path


# === int8 through NNCF ===


def matmul_roles(ov_model):
    """{role: [friendly names]} of the matmuls of our CaiT IR, found by what they read, not by name:

    - "linear": a MatMul with constant weights (qkv, projections, MLP), the head left out;
    - "head": the last of those, the classifier;
    - "head_mixes": the talking-heads mixes, `(H, H)` constants (times a 1 computed at run time,
      `inference_graph._mix_heads`) on the left;
    - "attention": the matmuls of two activations (q·kᵀ, attention·v) and OpenVINO's fused
      class attention (ScaledDotProductAttention);
    - "after_softmax": the attention·v matmuls, which read the (mixed) softmax.
    """
    roles = {role: [] for role in ("linear", "head", "head_mixes", "attention", "after_softmax")}
    for op in ov_model.get_ordered_ops():
        kind = op.get_type_name()
        if kind == "ScaledDotProductAttention":
            roles["attention"].append(op.get_friendly_name())
        if kind != "MatMul":
            continue
        constant = [_constant_source(op.input_value(index)) for index in (0, 1)]
        if constant[0] or _run_time_kernel(op.input_value(0)):
            roles["head_mixes"].append(op.get_friendly_name())
        elif constant[1]:
            roles["linear"].append(op.get_friendly_name())
        else:
            roles["attention"].append(op.get_friendly_name())
            if _reads_softmax(op.input_value(0)):
                roles["after_softmax"].append(op.get_friendly_name())
    roles["head"] = roles["linear"][-1:]
    roles["linear"] = roles["linear"][:-1]
    return roles


def _constant_source(output):
    node = output.get_node()
    while node.get_type_name() in ("Convert", "FakeQuantize"):
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Constant"


def _run_time_kernel(output):
    """Whether `output` is a 2-D constant times a computed scalar: a talking-heads mix's kernel."""
    node = output.get_node()
    return node.get_type_name() == "Multiply" and any(
        _constant_source(value) and len(value.get_partial_shape()) == 2 for value in node.input_values())


def _reads_softmax(output, depth=6):
    """Whether `output` is a softmax, through reshapes and the talking-heads mix after it."""
    node = output.get_node()
    if node.get_type_name() == "Softmax":
        return True
    if depth == 0 or node.get_type_name() not in ("Reshape", "Add", "MatMul", "Transpose"):
        return False
    return any(_reads_softmax(node.input_value(index), depth - 1) for index in range(node.get_input_size())
               if not _constant_source(node.input_value(index)))


def quantize_int8(ov_model, images, kept_float=KEPT_FLOAT):
    """(int8 model, `Quantized`): `nncf.quantize` with the transformer preset on `images`
    (N, H, W, 3), fed one at a time; the matmuls of the `kept_float` roles left float."""
    import nncf

    roles = matmul_roles(ov_model)
    ignored = [name for role in kept_float for name in roles[role]]
    dataset = nncf.Dataset(list(images), lambda image: image[None])
    start = time.perf_counter()
    with _quiet():  # NNCF's progress bars stay; its INFO lines name every op it leaves float
        quantized = nncf.quantize(
            ov_model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(images),
            ignored_scope=nncf.IgnoredScope(names=ignored) if ignored else None,
        )
    seconds = time.perf_counter() - start
    taking_int8 = sum(op.get_type_name() in ("MatMul", "Convolution", "ScaledDotProductAttention")
                      and "FakeQuantize" in {value.get_node().get_type_name() for value in op.input_values()}
                      for op in quantized.get_ops())
    return quantized, Quantized("int8", taking_int8, {role: len(roles[role]) for role in kept_float},
                                images=len(images), seconds=seconds)


def compress_weights_int8(ov_model):
    """(model with int8 weights, `Quantized`): `nncf.compress_weights`, data-free: the weights of every
    linear layer, the head and the patch embedding at int8, with a scale and zero point per output
    channel (the talking-heads mixes' `(H, H)` kernels, computed at run time, stay float)."""
    import nncf
    import openvino

    with _quiet():
        compressed = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    # The int8 constants but the zero points, (channels, 1) each.
    int8 = sum(op.get_type_name() == "Constant" and op.get_output_element_type(0) in (openvino.Type.u8, openvino.Type.i8)
               and list(op.get_output_shape(0))[-1:] > [1]
               for op in compressed.get_ops())
    return compressed, Quantized("int8_weights", int8, {})


@contextlib.contextmanager
def _quiet():
    """NNCF's INFO log and torch's CUDA probe (a warning and a log line, where torch is installed)
    silenced for the block; the loggers' levels and the warning filters are put back after it."""
    loggers = [logging.getLogger(name) for name in ("nncf", "torch.utils.cpp_extension")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="CUDA initialization")
        for logger in loggers:
            logger.setLevel(logging.WARNING if logger.name == "nncf" else logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


# What was measured of int8 against OpenVINO's bf16 (docs/export.md, "OpenVINO int8 with NNCF"; one
# interleaved run of benchmarks.inference per CPU kind): with AMX's bf16 tiles bf16 is as fast as int8
# or faster; with AVX512-BF16 alone int8 leads but at XXS24 batch 1; without bf16 units int8 leads f32.
AMX_CPU_NOTE = ("On this CPU (AMX) OpenVINO's bf16, its default for the float export here, was measured about as "
                "fast as int8 or faster: int8 0.84-1.18x bf16 (docs/export.md, OpenVINO int8 with NNCF)")


def int8_note(flags=None):
    """What `export` says beside an int8 export about the float path on this CPU: where AMX's bf16
    tiles make OpenVINO's bf16 (the float export's default there) about as fast, `AMX_CPU_NOTE`;
    elsewhere nothing, as int8 was measured the fastest path (`flags`: `keras_cait.cpu.cpu_flags()`)."""
    flags = cpu.cpu_flags() if flags is None else flags
    return AMX_CPU_NOTE if "amx_bf16" in flags and computes_bfloat16() else ""


def computes_bfloat16():
    """Whether OpenVINO's CPU plugin computes in bf16 on this CPU (AVX512-BF16 or AMX), where its
    default precision for the float export is bf16."""
    import openvino

    return "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


# === Calibration images ===


def _is_folder_name(calibration):
    return isinstance(calibration, (str, os.PathLike))


def check_calibration_size(calibration_size):
    counts = isinstance(calibration_size, (int, np.integer)) and not isinstance(calibration_size, bool)
    if not counts or calibration_size < 1:
        raise ArgumentError("calibration_size", calibration_size, "must be a positive number of images",
                            f"e.g. {CALIBRATION_SIZE} (NNCF's default)", usage=True)


def calibration_files(folder):
    """The image files of `folder` and its subfolders (hidden ones left out), sorted; refuses a
    missing folder, a file, and a folder without images, naming it and the kinds of image read."""
    from keras_cait.images.evaluation_transform import IMAGE_EXTENSIONS, IMAGE_FORMATS, is_image_file_name

    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "no such folder"
        raise ArgumentError("calibration", folder, what,
                            "give a folder of images like those the model will classify, e.g. its validation folder")
    files = []
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        files += [os.path.join(root, name) for name in sorted(names)
                  if is_image_file_name(name) and not name.startswith(".")]
    if not files:
        raise ArgumentError("calibration", folder, "no images in it or its subfolders",
                            f"give a folder of {IMAGE_FORMATS} files ({', '.join(IMAGE_EXTENSIONS)}) like those "
                            "the model will classify, e.g. its validation folder")
    return sorted(files)


def calibration_source(calibration):
    """`calibration` as the image files to read (a folder's, or a list of files) or a float32 array,
    checked before any model is traced; an `ArgumentError` naming `calibration` for anything else."""
    if _is_folder_name(calibration):
        return calibration_files(calibration)
    if isinstance(calibration, (list, tuple)) and calibration and all(map(_is_folder_name, calibration)):
        missing = next((file for file in calibration if not os.path.isfile(file)), None)
        if missing is not None:
            raise ArgumentError("calibration", None, f"{os.fspath(missing)!r} in the list is no file",
                                "give files of images, or their folder", shown="<list of files>")
        return [os.fspath(file) for file in calibration]
    allowed = ("give a folder of images like those the model will classify, a list of their files, or an array "
               "(N, H, W, 3) of them, RGB 0..255 in the model's evaluation transform")
    if not isinstance(calibration, (np.ndarray, list, tuple)):
        raise ArgumentError("calibration", None, f"a {type(calibration).__name__}, not images", allowed,
                            usage=True, shown=f"<{type(calibration).__name__}>")
    try:
        images = np.asarray(calibration, "float32")
    except (TypeError, ValueError):
        images = None
    if images is None or images.ndim != 4 or len(images) == 0:
        shape = "no array of images" if images is None else f"an array of shape {images.shape}, not images"
        raise ArgumentError("calibration", None, shape, allowed, usage=True, shown="<array>")
    if not np.isfinite(images).all():
        raise ArgumentError("calibration", None, "holds NaN or infinite values", allowed, usage=True,
                            shown="<array>")
    low, high = float(images.min()), float(images.max())
    if low < 0 or high > 255 or high <= 1:
        scaled = " (scaled, it seems: CaiT normalises 0..255 pixels itself)" if high <= 1 or low < 0 else ""
        raise ArgumentError("calibration", None, f"values from {low:g} to {high:g}, not 0..255{scaled}",
                            "give the images as 0..255 RGB, as the model takes them", usage=True, shown="<array>")
    return images


def calibration_images(calibration, model, size=CALIBRATION_SIZE):
    """float32 `(n, H, W, 3)` 0..255 images for NNCF from `calibration_source`'s answer: `size` of
    the files (spread evenly over them) read in the model's evaluation transform, or of the rows of
    the array, whose shape is checked against the model's input."""
    from keras_cait.preprocessing import load_image

    height, width = model.inputs[0].shape[1:3]
    if isinstance(calibration, list):
        chosen = [calibration[int(index)] for index in np.unique(np.linspace(0, len(calibration) - 1, size).round())]
        return np.stack([load_image(file, (height, width)) for file in chosen]).astype("float32")
    images = calibration
    if images.shape[1:] != (height, width, 3):
        raise ArgumentError("calibration", None, f"an array of shape {images.shape}, not the model's images",
                            f"give images (N, {height}, {width}, 3), RGB 0..255 in the model's evaluation transform, "
                            "or a folder of image files", usage=True, shown="<array>")
    return images[np.unique(np.linspace(0, len(images) - 1, size).round()).astype(int)]
