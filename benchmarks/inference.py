"""CPU inference speed of keras_cait's paths and timm's, timed in turns in one run.

    python -m benchmarks.inference --output rows.json            # XXS24 and S24, batch 1 and 16
    python -m benchmarks.inference --big --output big.json       # + M36 and M48 at batch 1
    python -m benchmarks.inference --smoke --output smoke.json   # tiny model, one round (a test)
    python -m benchmarks.inference --max-isa AVX512_CORE_VNNI --paths timm-eager keras-openvino ...
                                   # oneDNN capped: a CPU without bf16 units, emulated
    python -m benchmarks.inference --fill rows.json docs/benchmarks.md README.md

(from the repository root; the workers find this checkout's keras_cait whatever the cwd).

`--fill` writes a run's figures into the docs' placeholders: `{{XXS24 bs1 keras-onnx}}`
becomes that path's ratio to timm eager ("1.37×"), `{{XXS24 bs1 keras-onnx same runtime}}`
its ratio to timm's export on the same runtime (`SAME_RUNTIME`: our ONNX against timm's ONNX
under ONNX Runtime, our OpenVINO IR against timm's ONNX on OpenVINO, f32 and bf16),
`{{XXS24 bs1 timm-eager img/s}}` its images/s, `{{table}}` the three tables below,
`{{same runtime table}}` the third alone and `{{machine}}` the machine's state.

The default paths (`DEFAULT_PATHS`, 16 and the ceiling: 17 workers) are the peers a PyTorch
user reaches (timm eager, torch.compile, autocast bf16, ONNX Runtime and OpenVINO f32/bf16 on
timm's own ONNX export, and that export quantised to int8 by NNCF) and the paths a keras_cait user
takes; each worker records its peak memory (`peak_memory_mb`) in the JSON. Both int8 OpenVINO paths
make the same NNCF call (`nncf.quantize`, transformer preset) on the same photos
(`CALIBRATION_FOLDER`), each read in its own evaluation transform.

Ratios between frameworks are only meaningful if they share the machine's state:
torch's OpenMP threads collapse when anything else runs, TensorFlow's less so. So
every path gets one persistent worker process per model, all workers are loaded
(and warmed up) first, then they are timed in turns: round after round, each path
runs for `--seconds` while the others wait, in an order rotated every round. A
path's speed is the median over rounds; its ratio to timm eager is the median of
the per-round ratios. The machine's fp32 matmul ceiling is one more worker timed
in the same turns, so "% of ceiling" compares like with like. The load average
at start and end is recorded: run it on an otherwise idle machine.

Every worker uses `--threads` threads (torch.set_num_threads; TensorFlow intra-op
threads with one inter-op thread; ONNX Runtime intra_op_num_threads; OpenVINO
INFERENCE_NUM_THREADS) and the same
random timm weights, loaded into keras_cait through its converter, so both sides
compute the same model; each path's outputs are checked against timm eager's.
Images are random 0..255 pixels (float32); timm's paths get them normalised
outside the timed call, keras_cait's models normalise inside.

A path is a name and a loader in `PATHS`: `loader(spec, batches, workdir, threads)` builds
the model and returns `run(images) -> numpy outputs` (logits, or probabilities
where `PROBABILITIES` says so). Adding a path is adding one loader.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import CEILING, Worker, load_all, machine_state, protocol_channel, with_repository
from benchmarks.harness import matmul_ceiling, median_ratios, serve, timed_rounds, write_json
from benchmarks.input import make_photos
from benchmarks.training import forward_flops

VARIANTS = {  # keras_cait variant -> timm architecture at 224
    "XXS24": "cait_xxs24_224",
    "S24": "cait_s24_224",
    "M36": "cait_m36_384",
    "M48": "cait_m48_448",
}
SMOKE = dict(embed_dim=32, depth=1, num_heads=2, init_values=0.1, patch_size=8, image_size=32, classes=10)
REFERENCE = "timm-eager"
# `--max-isa`: oneDNN's kernels capped (ONEDNN_MAX_CPU_ISA) to those of a CPU kind this one emulates.
# AVX512_CORE_VNNI is an AVX-512 CPU with VNNI and no bf16 units. Not offered: AVX2 (OpenVINO 2026.4's
# Softmax then finds no kernel and the compile fails) and AVX512_CORE_BF16 (on an AMX Xeon its bf16 runs
# slower than f32, unlike the CPUs of that kind; a probe, docs/benchmarks.md).
MAX_ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
MAX_ISAS = ("AVX512_CORE_VNNI",)
# Paths whose outputs are probabilities (the serving signature adds the softmax).
PROBABILITIES = {"keras-saved-model", "keras-saved-model-xla", "keras-saved-model-bf16"}
PACKAGES = ("torch", "timm", "tensorflow", "keras", "onnxruntime", "openvino", "nncf")
# The int8 paths' calibration: JPEGs cut from scikit-learn's sample photos (`benchmarks.input.make_photos`),
# in this folder of the variant's workdir; ours reads them in keras_cait's evaluation transform, timm's in
# timm's (the same resize and crop for CaiT).
CALIBRATION_FOLDER = "calibration"
INT8_OPENVINO = ("keras-openvino-int8", "keras-openvino-int8-attention-float", "openvino-timm-onnx-int8")


# === Models ===


def _spec(variant):
    """What a worker needs to build both models: the timm architecture and its sizes.

    Read from timm's model, so that this process imports neither TensorFlow nor
    keras_cait (TensorFlow and torch in one process have crashed it).
    """
    if variant == "smoke":
        return dict(SMOKE, variant="smoke")
    # The extra rows time M36/M48 at 224 too: speed per image, not their released resolution.
    spec = dict(variant=variant, arch=VARIANTS[variant], image_size=224)
    model = _timm_model(spec)
    return dict(
        spec, embed_dim=model.embed_dim, depth=len(model.blocks), num_heads=model.blocks[0].attn.num_heads,
        init_values=model.blocks[0].gamma_1.detach()[0].item(), patch_size=model.patch_embed.patch_size[0],
        classes=model.num_classes,
    )


def _timm_model(spec):
    import timm
    from timm.models.cait import Cait

    if spec["variant"] == "smoke":
        return Cait(img_size=spec["image_size"], patch_size=spec["patch_size"], embed_dim=spec["embed_dim"],
                    depth=spec["depth"], num_heads=spec["num_heads"], init_values=spec["init_values"],
                    num_classes=spec["classes"]).eval()
    return timm.create_model(spec["arch"], img_size=spec["image_size"]).eval()


def _keras_model(spec, workdir, classifier_activation=None, dtype=None):
    from keras_cait.models.architecture import build_cait
    from keras_cait.weights import load_weights_file

    size = spec["image_size"]
    model = build_cait(
        embed_dim=spec["embed_dim"], depth=spec["depth"], num_heads=spec["num_heads"],
        init_values=spec["init_values"], patch_size=spec["patch_size"], input_shape=(size, size, 3),
        classes=spec["classes"], classifier_activation=classifier_activation, dtype=dtype,
    )
    load_weights_file(model, os.path.join(workdir, "timm.safetensors"))
    return model


def save_random_checkpoint(spec, workdir):
    """timm's model with seeded random weights, as a safetensors file both sides load."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = _timm_model(spec)
    with torch.no_grad():  # LayerScale and biases start at constants: randomise every parameter
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02).add_(torch.randn(()) * 0.01)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(workdir, "timm.safetensors"))


def calibration_photos(spec):
    """How many photos NNCF calibrates both int8 paths on: fewer than export's default 300, so that
    S24's two quantisations load in minutes; the smoke model's a handful."""
    return 8 if spec["variant"] == "smoke" else 64


def images(spec, batch):
    import numpy as np

    size = spec["image_size"]
    return np.random.RandomState(batch).randint(0, 256, (batch, size, size, 3)).astype("float32")


# === Paths: name -> loader(spec, batches, workdir, threads) -> run(images) ===


def _timm_loaded(spec, workdir):
    from safetensors.torch import load_file

    model = _timm_model(spec)
    model.load_state_dict(load_file(os.path.join(workdir, "timm.safetensors")))
    return model


def _normalised_nchw(spec):
    """pixels -> timm's input, cached per array: done outside the timed calls."""
    import numpy as np
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    mean = np.array(IMAGENET_DEFAULT_MEAN, "float32") * 255
    std = np.array(IMAGENET_DEFAULT_STD, "float32") * 255
    cache = {}

    def prepare(pixels):
        if id(pixels) not in cache:
            cache[id(pixels)] = (pixels, ((pixels - mean) / std).transpose(0, 3, 1, 2).copy())
        return cache[id(pixels)][1]

    return prepare


def _timm_eager(spec, batches, workdir, threads, compiled=False):
    import torch

    model = _timm_loaded(spec, workdir)
    if compiled:
        model = torch.compile(model, dynamic=False)
    prepare = _normalised_nchw(spec)

    def run(pixels):
        with torch.inference_mode():
            return model(torch.from_numpy(prepare(pixels))).numpy()

    return run


def _timm_compiled(spec, batches, workdir, threads):
    return _timm_eager(spec, batches, workdir, threads, compiled=True)


def _onnx_runtime(path, threads):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda feed: session.run(None, {name: feed})[0]


def _timm_autocast(spec, batches, workdir, threads):
    """timm eager under `torch.autocast("cpu", dtype=torch.bfloat16)`: bf16 matmuls, float32 logits."""
    import torch

    model, prepare = _timm_loaded(spec, workdir), _normalised_nchw(spec)

    def run(pixels):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(torch.from_numpy(prepare(pixels))).float().numpy()

    return run


def export_timm_onnx(spec, workdir, path):
    """timm's own ONNX export (torch.onnx.export, TorchScript exporter), input NCHW normalised."""
    import torch

    size = spec["image_size"]
    torch.onnx.export(
        _timm_loaded(spec, workdir), (torch.zeros(1, 3, size, size),), path, input_names=["images"],
        output_names=["logits"], dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False,
    )
    return path


def _ort_timm(spec, batches, workdir, threads):
    """timm's ONNX under ONNX Runtime."""
    path = export_timm_onnx(spec, workdir, os.path.join(workdir, "timm-ort.onnx"))
    session, prepare = _onnx_runtime(path, threads), _normalised_nchw(spec)
    return lambda pixels: session(prepare(pixels))


def _openvino(model, threads, precision):
    """`model` (a path or an `openvino.Model`) compiled for the CPU; precision None: OpenVINO's default
    for what an int8 model computes in float (bf16 where the CPU has it; f32 under `--max-isa`)."""
    import openvino

    if precision is None and os.environ.get(MAX_ISA_VARIABLE) in MAX_ISAS:
        # OpenVINO picks bf16 from the CPU's own flags, past oneDNN's cap: a CPU without bf16 units runs f32.
        precision = "f32"
    config = {"INFERENCE_NUM_THREADS": threads, **({"INFERENCE_PRECISION_HINT": precision} if precision else {})}
    compiled = openvino.Core().compile_model(model, "CPU", config)
    OBSERVED["openvino_precision"] = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
    return lambda feed: compiled(feed)[0]


def _ov_timm(spec, batches, workdir, threads, precision="f32"):
    """timm's ONNX on OpenVINO's CPU plugin, as a PyTorch user would serve it with OpenVINO."""
    # One file per worker: the workers load side by side.
    path = export_timm_onnx(spec, workdir, os.path.join(workdir, f"timm-openvino-{precision}.onnx"))
    compiled, prepare = _openvino(path, threads, precision), _normalised_nchw(spec)
    return lambda pixels: compiled(prepare(pixels))


def _ov_timm_bf16(spec, batches, workdir, threads):
    return _ov_timm(spec, batches, workdir, threads, precision="bf16")


def _ov_timm_int8(spec, batches, workdir, threads):
    """timm's ONNX quantised as a timm user would: converted to OpenVINO, then NNCF's call of
    `export_openvino(quantization="int8")` (`nncf.quantize`, transformer preset, every image of the
    calibration folder) on the same photos in timm's own evaluation transform; OpenVINO's default
    precision for what stays float."""
    import nncf
    import openvino

    path = export_timm_onnx(spec, workdir, os.path.join(workdir, "timm-openvino-int8.onnx"))
    images = _timm_calibration(spec, os.path.join(workdir, CALIBRATION_FOLDER))
    quantized = nncf.quantize(openvino.convert_model(path), nncf.Dataset(images), subset_size=len(images),
                              model_type=nncf.ModelType.TRANSFORMER)
    compiled, prepare = _openvino(quantized, threads, None), _normalised_nchw(spec)
    return lambda pixels: compiled(prepare(pixels))


def _timm_calibration(spec, folder):
    """The calibration photos as timm reads them for evaluation (resize, centre crop, normalise), NCHW."""
    from PIL import Image
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform

    transform = create_transform(input_size=(3, spec["image_size"], spec["image_size"]), interpolation="bicubic",
                                 crop_pct=1.0, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    files = sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names)
    return [transform(Image.open(file).convert("RGB")).numpy()[None] for file in files]


def _keras_predict(spec, batches, workdir, threads):
    model = _keras_model(spec, workdir)
    return lambda pixels: model.predict(pixels, verbose=0)


def _keras_predict_bf16(spec, batches, workdir, threads):
    """`model.predict` of the model built under the `mixed_bfloat16` policy (`dtype=`), as a Keras
    user runs it on a CPU with bfloat16 units."""
    model = _keras_model(spec, workdir, dtype="mixed_bfloat16")
    return lambda pixels: model.predict(pixels, verbose=0)


def _keras_predict_on_batch(spec, batches, workdir, threads):
    model = _keras_model(spec, workdir)
    return model.predict_on_batch


def _keras_xla(spec, batches, workdir, threads):
    model = _keras_model(spec, workdir)
    model.compile(jit_compile=True)
    return model.predict_on_batch


def _keras_saved_model(spec, batches, workdir, threads, compute_dtype="float32", jit_compile=False, folder=""):
    """`serving_default` as TF Serving runs it: loaded without keras_cait; XLA only where exported with it."""
    path = os.path.join(workdir, f"saved_model_{compute_dtype}_{'xla' if jit_compile else 'graph'}{folder}", "1")
    script = (
        "import sys; from keras_cait.export import export_saved_model; "
        "from benchmarks.inference import _keras_model, _spec; "
        "import json; spec = json.loads(sys.argv[1]); "
        "export_saved_model(_keras_model(spec, sys.argv[2], 'softmax'), sys.argv[3], "
        "top_k=min(5, spec['classes']), class_names=[str(i) for i in range(spec['classes'])], "
        f"compute_dtype={compute_dtype!r}, jit_compile={jit_compile})"
    )
    # Exported in a child process, so that this one never imports keras_cait (nor Keras).
    subprocess.run([sys.executable, "-c", script, json.dumps(spec), workdir, path], check=True, stdout=sys.stderr,
                   env=with_repository())
    import tensorflow as tf

    signature = tf.saved_model.load(path).signatures["serving_default"]
    assert "keras_cait" not in sys.modules, "the SavedModel must be served without keras_cait"
    return lambda pixels: signature(images=tf.constant(pixels))["probabilities"].numpy()


def _keras_saved_model_xla(spec, batches, workdir, threads):
    """`export_saved_model(jit_compile=True)`: TF Serving with --xla_cpu_compilation_enabled."""
    return _keras_saved_model(spec, batches, workdir, threads, jit_compile=True)


def _keras_saved_model_bf16(spec, batches, workdir, threads):
    """`export_saved_model(compute_dtype="bfloat16")`: bfloat16 matmuls, no XLA."""
    return _keras_saved_model(spec, batches, workdir, threads, compute_dtype="bfloat16")


def _keras_saved_model_onednn(spec, batches, workdir, threads):
    """The float32 SavedModel, exported and served with oneDNN's ops on (its own folder: the two export at once)."""
    return _keras_saved_model(spec, batches, workdir, threads, folder="_onednn")


def _keras_onnx(spec, batches, workdir, threads, quantization=None):
    path = os.path.join(workdir, f"keras_cait_{quantization}.onnx")
    from keras_cait.export import export_onnx

    export_onnx(_keras_model(spec, workdir), path, quantization=quantization)
    return _onnx_runtime(path, threads)


def _keras_quantized(spec, batches, workdir, threads, mode="int8"):
    """Keras' `model.quantize(mode)` of every Dense: int8 or int4 kernels with each input quantised
    per token on the fly, or float8's rounding of inputs and kernels (docs/export.md)."""
    model = _keras_model(spec, workdir)
    model.quantize(mode, filters=lambda layer: layer.__class__.__name__ == "Dense")
    return model.predict_on_batch


def _keras_int4(spec, batches, workdir, threads):
    return _keras_quantized(spec, batches, workdir, threads, mode="int4")


def _keras_float8(spec, batches, workdir, threads):
    return _keras_quantized(spec, batches, workdir, threads, mode="float8")


def _keras_int8_onnx(spec, batches, workdir, threads):
    return _keras_onnx(spec, batches, workdir, threads, quantization="int8")


def _keras_openvino(spec, batches, workdir, threads, precision="f32"):
    """Our OpenVINO IR (export_openvino) on OpenVINO's CPU plugin."""
    from keras_cait.export import export_openvino

    path = os.path.join(workdir, f"keras_cait-{precision}.xml")
    export_openvino(_keras_model(spec, workdir), path)
    return _openvino(path, threads, precision)


def _keras_openvino_bf16(spec, batches, workdir, threads):
    """OpenVINO's default on a CPU with bfloat16 (AVX512-BF16, AMX): bf16 arithmetic."""
    return _keras_openvino(spec, batches, workdir, threads, precision="bf16")


def _keras_openvino_int8(spec, batches, workdir, threads):
    """Our OpenVINO IR quantised by `export_openvino(quantization="int8")` (NNCF) on the calibration
    photos; OpenVINO's default precision for what stays float."""
    from keras_cait.export import export_openvino

    path, folder = os.path.join(workdir, "keras_cait-int8.xml"), os.path.join(workdir, CALIBRATION_FOLDER)
    export_openvino(_keras_model(spec, workdir), path, quantization="int8", calibration=folder,
                    calibration_size=calibration_photos(spec))
    return _openvino(path, threads, None)


def _keras_openvino_int8_attention_float(spec, batches, workdir, threads):
    """`keras-openvino-int8` with the attention matmuls (q·kᵀ, attention·v, class attention) kept float
    too: NNCF's call with more of `matmul_roles` in its ignored scope (an A/B of `KEPT_FLOAT`)."""
    import functools

    from keras_cait.export import export_openvino
    from keras_cait.export import openvino as exporter

    exporter.quantize_int8 = functools.partial(exporter.quantize_int8, kept_float=("head_mixes", "attention"))
    path = os.path.join(workdir, "keras_cait-int8-attention-float.xml")
    export_openvino(_keras_model(spec, workdir), path, quantization="int8",
                    calibration=os.path.join(workdir, CALIBRATION_FOLDER), calibration_size=calibration_photos(spec))
    return _openvino(path, threads, None)


PATHS = {
    "timm-eager": _timm_eager,
    "timm-compile": _timm_compiled,
    "timm-autocast-bf16": _timm_autocast,
    "ort-timm-onnx": _ort_timm,
    "openvino-timm-onnx": _ov_timm,
    "openvino-timm-onnx-bf16": _ov_timm_bf16,
    "keras-predict": _keras_predict,
    "keras-predict-bf16": _keras_predict_bf16,
    "keras-predict-on-batch": _keras_predict_on_batch,
    "keras-xla": _keras_xla,
    "keras-saved-model": _keras_saved_model,
    "keras-saved-model-xla": _keras_saved_model_xla,
    "keras-saved-model-bf16": _keras_saved_model_bf16,
    "keras-onnx": _keras_onnx,
    "keras-int8": _keras_quantized,
    "keras-int4": _keras_int4,
    "keras-float8": _keras_float8,
    "keras-int8-onnx": _keras_int8_onnx,
    "keras-openvino": _keras_openvino,
    "keras-openvino-bf16": _keras_openvino_bf16,
    "keras-openvino-int8": _keras_openvino_int8,
    "keras-openvino-int8-attention-float": _keras_openvino_int8_attention_float,
    "openvino-timm-onnx-int8": _ov_timm_int8,
    # Levers: the same paths with oneDNN's ops on, which TensorFlow turns on by itself only on
    # CPUs with AVX-512 VNNI or newer (`keras-cait` turns them on everywhere).
    "keras-predict-onednn": _keras_predict,
    "keras-saved-model-onednn": _keras_saved_model_onednn,
}
# Paths that compute in bf16 whatever the CPU: refused under `--max-isa`.
BFLOAT16_PATHS = ("timm-autocast-bf16", "openvino-timm-onnx-bf16", "keras-predict-bf16", "keras-saved-model-bf16",
                  "keras-openvino-bf16")
PEERS = ("timm-eager", "timm-compile", "timm-autocast-bf16", "ort-timm-onnx", "openvino-timm-onnx",
         "openvino-timm-onnx-bf16", "openvino-timm-onnx-int8")
# The default run: 15 paths + the ceiling = 16 workers (13 + 1 held S24 in 24 GB); the other
# paths (Keras int8, int4, float8, predict_on_batch, XLA predict) are there for --paths.
DEFAULT_PATHS = ("timm-eager", "timm-compile", "timm-autocast-bf16", "ort-timm-onnx", "openvino-timm-onnx",
                 "openvino-timm-onnx-bf16", "openvino-timm-onnx-int8", "keras-predict", "keras-predict-bf16",
                 "keras-saved-model", "keras-saved-model-xla", "keras-saved-model-bf16", "keras-onnx", "keras-openvino",
                 "keras-openvino-bf16", "keras-openvino-int8")
# The float32 exports, which the SavedModel's speed is measured against.
FLOAT32_EXPORTS = ("keras-saved-model", "keras-saved-model-xla", "keras-onnx", "keras-openvino")
# Our path -> the peer on the same runtime and precision: the ratio that shows what the export
# itself is worth. TensorFlow's paths have no timm counterpart; timm eager is what they replace.
SAME_RUNTIME = {
    "keras-onnx": "ort-timm-onnx",
    "keras-openvino": "openvino-timm-onnx",
    "keras-openvino-bf16": "openvino-timm-onnx-bf16",
    "keras-openvino-int8": "openvino-timm-onnx-int8",
    "keras-openvino-int8-attention-float": "openvino-timm-onnx-int8",
    "keras-predict": "timm-eager",
    "keras-saved-model": "timm-eager",
    "keras-saved-model-xla": "timm-eager",
    "keras-saved-model-bf16": "timm-autocast-bf16",
    "keras-predict-onednn": "timm-eager",
    "keras-predict-bf16": "timm-autocast-bf16",
    "keras-saved-model-onednn": "timm-eager",
}
# M36/M48 (--big): the paths users take, as few workers as that (each holds 1-2 GB of weights).
BIG_PATHS = ("timm-eager", "ort-timm-onnx", "keras-predict", "keras-saved-model", "keras-onnx")
LABELS = {
    "timm-eager": "timm eager",
    "timm-compile": "timm + torch.compile",
    "timm-autocast-bf16": "timm, autocast bf16",
    "ort-timm-onnx": "ORT on timm's ONNX",
    "openvino-timm-onnx": "OpenVINO (f32) on timm's ONNX",
    "openvino-timm-onnx-bf16": "OpenVINO (bf16) on timm's ONNX",
    "keras-predict": "`model.predict`",
    "keras-predict-bf16": "`model.predict`, `mixed_bfloat16`",
    "keras-predict-on-batch": "`predict_on_batch`",
    "keras-xla": "`predict_on_batch`, `jit_compile=True`",
    "keras-saved-model": "SavedModel `serving_default`",
    "keras-saved-model-xla": "SavedModel, `jit_compile=True`",
    "keras-saved-model-bf16": "SavedModel, bfloat16",
    "keras-onnx": "our ONNX under ORT",
    "keras-int8": "Keras int8 `predict_on_batch`",
    "keras-int4": "Keras int4 `predict_on_batch`",
    "keras-float8": "Keras float8 `predict_on_batch`",
    "keras-int8-onnx": "our int8 ONNX under ORT",
    "keras-openvino": "OpenVINO (f32)",
    "keras-openvino-bf16": "OpenVINO (bf16)",
    "keras-openvino-int8": "OpenVINO int8 (NNCF)",
    "keras-openvino-int8-attention-float": "OpenVINO int8 (NNCF), attention float",
    "openvino-timm-onnx-int8": "OpenVINO int8 (NNCF) on timm's ONNX",
    "keras-predict-onednn": "`model.predict`, oneDNN's ops on (`TF_ENABLE_ONEDNN_OPTS=1`)",
    "keras-saved-model-onednn": "SavedModel `serving_default`, oneDNN's ops on (`TF_ENABLE_ONEDNN_OPTS=1`)",
}


# === Worker: loads one path, then answers "time" requests ===


def _set_threads(path, threads):
    """Only the frameworks the path uses are imported (memory: all workers live at once)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if path.endswith("-onednn"):
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    if path.startswith("keras-") or path == CEILING:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if not path.startswith("keras-"):
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)


# What a worker's loader observed of how its path runs, sent as its ready message's "levers" (a row's
# `levers`): OpenVINO's compiled precision, and oneDNN's cap where `--max-isa` set one.
OBSERVED = {}


def worker(path, spec, batches, workdir, threads):
    channel = protocol_channel()
    _set_threads(path, threads)
    start = time.perf_counter()
    if path == CEILING:
        return serve(channel, matmul_ceiling(), {}, ceiling=True, started=start)
    run = PATHS[path](spec, batches, workdir, threads)
    OBSERVED["onednn_max_cpu_isa"] = os.environ.get(MAX_ISA_VARIABLE)
    serve(channel, run, {batch: images(spec, batch) for batch in batches}, started=start,
          levers=lambda: dict(OBSERVED))


# === The run: load all, then rounds of turns ===


def _max_relative_difference(output, reference, probabilities):
    import numpy as np

    output, reference = np.asarray(output), np.asarray(reference)
    if probabilities:
        reference = np.exp(reference - reference.max(-1, keepdims=True))
        reference /= reference.sum(-1, keepdims=True)
    return float(np.abs(output - reference).max() / np.abs(reference).max())


def measure_variant(variant, batches, paths, args, workdir):
    """Rows (one per batch and path) of one model, all its paths timed in turns."""
    spec = _spec(variant)
    save_random_checkpoint(spec, workdir)
    if any(path in INT8_OPENVINO for path in paths):
        make_photos(os.path.join(workdir, CALIBRATION_FOLDER), calibration_photos(spec))
    # Loaded side by side: tracing, exports and torch.compile are mostly single-threaded.
    arguments = ["--spec", json.dumps(spec), "--batches", *map(str, batches), "--workdir", workdir,
                 "--threads", str(args.threads)]
    environment = {MAX_ISA_VARIABLE: args.max_isa} if args.max_isa else None
    workers = {path: Worker("benchmarks.inference", path, arguments, os.path.join(args.logs, f"{variant}-{path}.log"),
                            environment) for path in (*paths, CEILING)}
    load_all(workers, variant)
    flops = forward_flops(spec["image_size"], spec["patch_size"], spec["embed_dim"], spec["depth"],
                          spec["num_heads"], spec["classes"])
    speeds, ceilings, memory = timed_rounds(workers, paths, batches, args.rounds, args.seconds, variant)
    for worker_ in workers.values():
        worker_.close()

    ceiling = statistics.median(ceilings)
    rows = []
    for batch in batches:
        reference = workers[REFERENCE].ready["outputs"][str(batch)] if REFERENCE in paths else None
        for path in paths:
            samples = speeds[batch, path]
            row = dict(variant=variant, batch=batch, path=path, images_per_second=statistics.median(samples),
                       rounds=samples, gflops=statistics.median(samples) * flops / 1e9,
                       ceiling_gflops=ceiling, forward_gflops_per_image=flops / 1e9,
                       peak_memory_mb=memory[path], levers=workers[path].ready["levers"])
            row["fraction_of_ceiling"] = row["gflops"] / ceiling
            if reference is not None:
                row["ratio_to_timm_eager"] = median_ratios(samples, speeds[batch, REFERENCE])
                row["max_relative_difference"] = _max_relative_difference(
                    workers[path].ready["outputs"][str(batch)], reference, path in PROBABILITIES)
            peer = SAME_RUNTIME.get(path)
            if peer in paths:
                row["same_runtime_peer"] = peer
                row["ratio_to_same_runtime"] = median_ratios(samples, speeds[batch, peer])
            rows.append(row)
    return rows


def same_runtime_markdown(rows):
    """Our exports against timm's export on the same runtime and precision, and TensorFlow's paths
    against timm eager: the median of the per-round ratios."""
    pairs = [(path, peer) for path, peer in SAME_RUNTIME.items()
             if any(row["path"] == path and "ratio_to_same_runtime" in row for row in rows)]
    if not pairs:
        return ""
    cases = list(dict.fromkeys((row["variant"], row["batch"]) for row in rows))
    by = {(row["variant"], row["batch"], row["path"]): row for row in rows}
    lines = ["| case | " + " | ".join(f"{LABELS[path]} / {LABELS[peer]}" for path, peer in pairs) + " |",
             "|---|" + "---|" * len(pairs)]
    for variant, batch in cases:
        cells = [f"{by[variant, batch, path]['ratio_to_same_runtime']:.2f}×"
                 if "ratio_to_same_runtime" in by.get((variant, batch, path), {}) else "–" for path, _ in pairs]
        lines.append(f"| {variant} bs{batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(rows):
    """The images/s of timm eager and every path's ratio to it; then the best path's efficiency;
    then our exports against timm's on the same runtime (`same_runtime_markdown`)."""
    paths = list(dict.fromkeys(row["path"] for row in rows))
    cases = list(dict.fromkeys((row["variant"], row["batch"]) for row in rows))
    by = {(row["variant"], row["batch"], row["path"]): row for row in rows}
    lines = ["| case | " + " | ".join(LABELS.get(p, p) for p in paths) + " |",
             "|---|" + "---|" * len(paths)]
    for variant, batch in cases:
        cells = []
        for path in paths:
            row = by.get((variant, batch, path))
            if row is None:
                cells.append("–")
            elif path == REFERENCE:
                cells.append(f"{row['images_per_second']:.2f} img/s")
            else:
                cells.append(f"{row.get('ratio_to_timm_eager', math.nan):.2f}×")
        lines.append(f"| {variant} bs{batch} | " + " | ".join(cells) + " |")
    lines += ["", "| case | best keras_cait path | images/s | GFLOP/s | matmul ceiling GFLOP/s | % of ceiling "
              "| best peer | best keras_cait / best peer | best float32 export | SavedModel / it "
              "| SavedModel (XLA) / it |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant, batch in cases:
        ours = [by[variant, batch, p] for p in paths if p.startswith("keras-") and (variant, batch, p) in by]
        peers = [by[variant, batch, p] for p in paths if p in PEERS and (variant, batch, p) in by]
        if not ours:
            continue
        best = max(ours, key=lambda row: row["images_per_second"])
        peer = max(peers, key=lambda row: row["images_per_second"]) if peers else None
        exports = [by[variant, batch, p] for p in FLOAT32_EXPORTS if (variant, batch, p) in by]
        export = max(exports, key=lambda row: row["images_per_second"]) if exports else None

        def share(path):
            row = by.get((variant, batch, path))
            return f"{row['images_per_second'] / export['images_per_second']:.2f}×" if row and export else "–"

        lines.append(
            f"| {variant} bs{batch} | {LABELS.get(best['path'], best['path'])} | {best['images_per_second']:.2f} "
            f"| {best['gflops']:.1f} | {best['ceiling_gflops']:.1f} | {100 * best['fraction_of_ceiling']:.0f} % "
            f"| {LABELS.get(peer['path'], peer['path']) if peer else '–'} "
            f"| {(best['images_per_second'] / peer['images_per_second']) if peer else math.nan:.2f}× "
            f"| {LABELS.get(export['path'], export['path']) if export else '–'} "
            f"| {share('keras-saved-model')} | {share('keras-saved-model-xla')} |"
        )
    same_runtime = same_runtime_markdown(rows)
    return "\n".join(lines + ["", same_runtime] if same_runtime else lines)


def machine_text(machine):
    return (
        f"{machine['cores']} cores ({machine['machine']}), {machine['threads']} threads per worker, "
        f"{machine['rounds']} rounds × {machine['seconds_per_turn']:g} s per turn, "
        f"{machine['wall_seconds'] / 60:.0f} min; load average (1, 5, 15 min) "
        f"{', '.join(f'{x:.2f}' for x in machine['load_average_start'])} at the start, "
        f"{', '.join(f'{x:.2f}' for x in machine['load_average_end'])} at the end; "
        f"PyTorch {machine['torch']}, timm {machine['timm']}, TensorFlow {machine['tensorflow']}, "
        f"Keras {machine['keras']}, ONNX Runtime {machine['onnxruntime']}, OpenVINO {machine['openvino']}, "
        f"NNCF {machine.get('nncf', 'not recorded')}, "
        f"Python {machine['python']}"
        + (f"; oneDNN capped at {machine['onednn_max_cpu_isa']} (ONEDNN_MAX_CPU_ISA, an emulation)"
           if machine.get("onednn_max_cpu_isa") else "")
    )


def fill(results_path, documents):
    """Replaces the placeholders of `documents` with the figures of one run's JSON."""
    results = json.load(open(results_path))
    values = {"table": markdown(results["rows"]), "machine": machine_text(results["machine"])}
    values["same runtime table"] = same_runtime_markdown(results["rows"])
    for row in results["rows"]:
        case = f"{row['variant']} bs{row['batch']} {row['path']}"
        values[case] = f"{row['ratio_to_timm_eager']:.2f}×"
        if "ratio_to_same_runtime" in row:
            values[case + " same runtime"] = f"{row['ratio_to_same_runtime']:.2f}×"
        values[case + " img/s"] = f"{row['images_per_second']:.2f}"
        values[case + " % ceiling"] = f"{100 * row['fraction_of_ceiling']:.0f} %"
    for document in documents:
        text = open(document).read()
        for name, value in values.items():
            text = text.replace("{{" + name + "}}", value)
        with open(document + ".part", "w") as file:
            file.write(text)
        os.replace(document + ".part", document)
        left = sorted(set(re.findall(r"\{\{[^}]*\}\}", text)))
        print(f"filled {document}" + (f"; not in this run: {', '.join(left)}" if left else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["XXS24", "S24"], choices=list(VARIANTS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--big", action="store_true",
                        help=f"add M36 and M48 at batch 1 (at 224), paths {', '.join(BIG_PATHS)}")
    parser.add_argument("--paths", nargs="+", default=list(DEFAULT_PATHS), choices=list(PATHS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="each path's turn (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-isa", choices=MAX_ISAS,
                        help="cap oneDNN's kernels in every worker (ONEDNN_MAX_CPU_ISA) to emulate an older CPU: "
                             "AVX512_CORE_VNNI is AVX-512 with VNNI and no bf16 units (OpenVINO's float parts "
                             "then run f32, as there); recorded in the JSON, not the CPU itself")
    parser.add_argument("--smoke", action="store_true", help="tiny model, one short round: checks every path")
    parser.add_argument("--output", help="write the rows as JSON here")
    parser.add_argument("--logs", help="folder for the workers' logs (default: a temporary one)")
    parser.add_argument("--fill", nargs="+", metavar=("RESULTS_JSON", "DOCUMENT"),
                        help="write the figures of RESULTS_JSON into the placeholders of the documents")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fill:
        return fill(args.fill[0], args.fill[1:])
    if args.worker:
        return worker(args.worker, json.loads(args.spec), args.batches, args.workdir, args.threads)
    if REFERENCE not in args.paths:
        parser.error(f"--paths must include {REFERENCE}: every ratio is to it")
    bfloat16 = [path for path in args.paths if path in BFLOAT16_PATHS]
    if args.max_isa and bfloat16:
        parser.error(f"--paths {' '.join(bfloat16)} compute in bf16, which --max-isa {args.max_isa} has no units "
                     f"for; leave them out")

    cases = [(variant, args.batches, args.paths) for variant in args.variants]
    if args.smoke:
        cases, args.rounds, args.seconds = [("smoke", [1, 2], args.paths)], 1, 0.2
    elif args.big:
        big_paths = [path for path in args.paths if path in BIG_PATHS]
        cases += [("M36", [1], big_paths), ("M48", [1], big_paths)]
    start_load = os.getloadavg()
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        args.logs = args.logs or os.path.join(workdir, "logs")
        os.makedirs(args.logs, exist_ok=True)
        for variant, batches, paths in cases:
            variant_dir = os.path.join(workdir, variant)
            os.makedirs(variant_dir)
            rows += measure_variant(variant, batches, paths, args, variant_dir)
    machine = machine_state(args.threads, args.rounds, args.seconds, start_load, started, PACKAGES)
    machine["onednn_max_cpu_isa"] = args.max_isa
    print(machine_text(machine))
    print(markdown(rows))
    if args.output:
        write_json({"machine": machine, "rows": rows}, args.output)


if __name__ == "__main__":
    sys.exit(main())
