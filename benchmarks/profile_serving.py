"""Where a served CaiT spends its time: TensorFlow's profiler on the SavedModel's `serving_default`,
and OpenVINO's per-node counters on our IR against timm's ONNX.

    python -m benchmarks.profile_serving --variant XXS24 --batch 1
    python -m benchmarks.profile_serving --variant XXS24 --batch 1 --compute-dtype bfloat16
    python -m benchmarks.profile_serving --variant S24 --batch 1 --openvino f32

The weights are benchmarks/inference.py's (timm's model, every parameter random),
written once into `--workdir`. The SavedModel (`export_saved_model`, with
`--compute-dtype` and `--jit`) is exported in a child process and profiled in a process
that never imports keras_cait, as TF Serving runs it: `--calls` calls traced by
`tf.profiler`, each TensorFlow op's time summed by op type (the kernels that ran:
`_FusedMatMul` is a MatMul + BiasAdd (+ GELU) that Grappler fused, `_MklNativeFusedMatMul`
the same run by oneDNN, which TensorFlow turns on only where the CPU has AVX-512 VNNI or
newer). With
`--openvino f32|bf16` it runs our IR (`export_openvino`) and timm's own ONNX export
under OpenVINO's performance counters at `--batch` (`graph_counts.openvino_counts`)
and prints each layer type's share of the time. Times under a profiler are longer
than without; compare shares, not totals, with the benchmark. Prints one table
per model and writes nothing else.
"""

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.harness import with_repository

# Events of the executor's threads that wrap or split ops rather than being ops.
EXECUTOR_EVENTS = {"Process", "ExecutorDoneCallback", "ParallelFor"}


def _prepare(variant, workdir):
    """The spec and random weights of benchmarks/inference.py, made by a child process (torch)."""
    spec_path = os.path.join(workdir, "spec.json")
    if not os.path.exists(spec_path):
        script = ("import json, sys; from benchmarks.inference import _spec, save_random_checkpoint; "
                  "spec = _spec(sys.argv[1]); save_random_checkpoint(spec, sys.argv[2]); "
                  "json.dump(spec, open(sys.argv[3], 'w'))")
        subprocess.run([sys.executable, "-c", script, variant, workdir, spec_path], check=True,
                       env=with_repository(), stdout=sys.stderr)
    with open(spec_path) as file:
        return json.load(file)


def _export(spec, workdir, script, *arguments):
    """Runs `script` in a child process with `model` (the random-weight Keras CaiT) and `out` defined."""
    prologue = ("import json, sys; from benchmarks.inference import _keras_model; "
                "spec = json.loads(sys.argv[1]); out = sys.argv[3]; ")
    subprocess.run([sys.executable, "-c", prologue + script, json.dumps(spec), workdir, *arguments], check=True,
                   env=with_repository(), stdout=sys.stderr)


def profile_saved_model(spec, workdir, batch, compute_dtype, jit_compile, calls):
    """{op type: (ms per call, ops per call)} of `serving_default` under TensorFlow's profiler."""
    path = os.path.join(workdir, f"saved_model_{compute_dtype}_{'xla' if jit_compile else 'graph'}", "1")
    if not os.path.exists(path):
        _export(spec, workdir, "from keras_cait.export import export_saved_model; "
                "export_saved_model(_keras_model(spec, sys.argv[2], 'softmax'), out, "
                "class_names=[str(i) for i in range(spec['classes'])], "
                f"compute_dtype={compute_dtype!r}, jit_compile={jit_compile})", path)
    import numpy as np
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    signature = tf.saved_model.load(path).signatures["serving_default"]
    assert "keras_cait" not in sys.modules
    size = spec["image_size"]
    images = tf.constant(np.random.RandomState(0).randint(0, 256, (batch, size, size, 3)).astype("float32"))
    for _ in range(5):
        signature(images=images)
    trace = tempfile.mkdtemp()
    tf.profiler.experimental.start(trace)
    for _ in range(calls):
        signature(images=images)["probabilities"].numpy()
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True)[0], "rb") as file:
        space.ParseFromString(file.read())
    times, counts = collections.Counter(), collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):  # the executor's threads: one event per op run
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                op = name.rsplit(":", 1)[1] if ":" in name else None  # "op name:op type"
                if op and op not in EXECUTOR_EVENTS:
                    times[op] += event.duration_ps / 1e9 / calls
                    counts[op] += 1 / calls
    return {op: (times[op], counts[op]) for op in times}


def profile_openvino(spec, workdir, batch, precision, seconds):
    """{model: result of graph_counts.openvino_counts} for our IR and timm's ONNX on OpenVINO at `batch`."""
    ours, timms = os.path.join(workdir, "ours.xml"), os.path.join(workdir, "timm.onnx")
    if not os.path.exists(ours):
        _export(spec, workdir, "from keras_cait.export import export_openvino; "
                "export_openvino(_keras_model(spec, sys.argv[2]), out)", ours)
    if not os.path.exists(timms):
        script = ("import json, sys; from benchmarks.inference import export_timm_onnx; "
                  "export_timm_onnx(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])")
        subprocess.run([sys.executable, "-c", script, json.dumps(spec), workdir, timms], check=True,
                       env=with_repository(), stdout=sys.stderr)
    import numpy as np

    from benchmarks.graph_counts import openvino_counts
    from benchmarks.inference import _normalised_nchw

    size = spec["image_size"]
    pixels = np.random.RandomState(0).randint(0, 256, (batch, size, size, 3)).astype("float32")
    return {"ours": openvino_counts(ours, precision, seconds, pixels),
            "timm": openvino_counts(timms, precision, seconds, _normalised_nchw(spec)(pixels))}


def table(title, rows, top):
    total = sum(ms for ms, _ in rows.values())
    lines = [f"{title}: {total:.2f} ms per call, {sum(n for _, n in rows.values()):.0f} ops", "",
             "| op | ms per call | share | ops per call |", "|---|---|---|---|"]
    for op, (ms, count) in sorted(rows.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"| {op} | {ms:.2f} | {100 * ms / total:.0f} % | {count:.0f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="XXS24", choices=["XXS24", "S24", "M36", "M48", "smoke"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the SavedModel's compute dtype (export_saved_model's compute_dtype)")
    parser.add_argument("--jit", action="store_true", help="the SavedModel exported with jit_compile=True")
    parser.add_argument("--openvino", choices=["f32", "bf16"],
                        help="profile our OpenVINO IR and timm's ONNX on OpenVINO instead, at this precision hint")
    parser.add_argument("--by-shape", action="store_true",
                        help="with --openvino: ms per call of each layer type, kernel and input shapes as well")
    parser.add_argument("--calls", type=int, default=10, help="profiled calls of the SavedModel")
    parser.add_argument("--seconds", type=float, default=5.0, help="profiled seconds of each OpenVINO model")
    parser.add_argument("--top", type=int, default=12, help="rows per table")
    parser.add_argument("--workdir", help="keeps the weights and exports between calls (default: a temporary folder)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    workdir = args.workdir or tempfile.mkdtemp()
    os.makedirs(workdir, exist_ok=True)
    spec = _prepare(args.variant, workdir)
    case = f"{args.variant} bs{args.batch}"
    if args.openvino:
        for name, counts in profile_openvino(spec, workdir, args.batch, args.openvino, args.seconds).items():
            shares = sorted(counts["time_share_by_type"].items(), key=lambda item: -item[1])[:args.top]
            print(f"{case}, OpenVINO {args.openvino}, {name}: {counts['executed']} layers, "
                  f"{counts['reorders']} reorders\n\n| layer (kernel) | share of the time |\n|---|---|")
            print("\n".join(f"| {layer} | {100 * share:.0f} % |" for layer, share in shares), end="\n\n")
            if args.by_shape:
                print(f"{case}, OpenVINO {args.openvino}, {name}: {counts['ms_per_call']:.1f} ms per call (counters)"
                      "\n\n| layer (kernel) inputs | ms per call |\n|---|---|")
                rows = list(counts["ms_per_call_by_shape"].items())[:args.top]
                print("\n".join(f"| {layer} | {ms:.1f} |" for layer, ms in rows), end="\n\n")
    else:
        rows = profile_saved_model(spec, workdir, args.batch, args.compute_dtype, args.jit, args.calls)
        print(table(f"{case}, SavedModel serving_default, {args.compute_dtype}{', XLA' if args.jit else ''}",
                    rows, args.top))


if __name__ == "__main__":
    main()
