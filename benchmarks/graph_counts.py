"""Op and node counts of keras_cait's exports next to timm's, and OpenVINO's per-node profile.

    python -m benchmarks.graph_counts --variant XXS24 --output counts.json

For one CaiT (random timm weights, loaded into keras_cait through its converter):

- TensorFlow: the ops of the function that `serving_default` runs, in the saved
  graph and as executed after Grappler and oneDNN's rewrites (a frozen copy run
  once in a session on one image, partition graphs read back), for the folded
  inference graph that the exports write (`keras_cait.export.inference_graph`) and for
  the Keras model traced as it is;
- ONNX: the nodes of `export_onnx`'s file and of timm's `torch.onnx.export`, and
  those ONNX Runtime runs after its fusions (its saved optimised graph);
- OpenVINO: the nodes OpenVINO's CPU plugin executes (its runtime model) for our
  `export_openvino` IR and for timm's ONNX, at f32 and bf16 inference precision:
  by layer type, how many run in bf16, how many are Reorders; with
  `--profile-seconds`, each layer type's share of the time from OpenVINO's
  performance counters.

Counts do not depend on the machine's load; the time shares are relative and
hold roughly on a busy machine, absolute times do not (they are not printed).
"""

import argparse
import collections
import json
import os
import sys
import tempfile

from benchmarks.inference import _keras_model, _spec, export_timm_onnx, save_random_checkpoint

# Ops that are not computation: graph plumbing of a session run.
PLUMBING = {"Const", "_Arg", "_Retval", "NoOp", "_Recv", "_Send", "Placeholder", "Identity"}


def tensorflow_counts(function, image_shape):
    """(ops in the traced graph, Counter of the ops executed after Grappler) for `function` on one image."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = tf.function(function, autograph=False).get_concrete_function(
        tf.TensorSpec([None, *image_shape], tf.float32)
    )
    frozen = convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    graph = tf.Graph()
    # Placed on the CPU before Grappler runs, as in TF Serving: oneDNN's fusions look at the device.
    with graph.as_default(), tf.device("/device:CPU:0"):
        tf.graph_util.import_graph_def(graph_def, name="")
    images = graph.get_tensor_by_name(frozen.inputs[0].name)
    outputs = graph.get_tensor_by_name(frozen.outputs[0].name)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=1)
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        session.run(outputs, {images: np.zeros([1, *image_shape], "float32")},
                    options=tf.compat.v1.RunOptions(output_partition_graphs=True), run_metadata=metadata)
    executed = collections.Counter()
    for partition in metadata.partition_graphs:
        for node in partition.node:
            if node.op in PLUMBING:
                continue
            fused = [op.decode() for op in node.attr["fused_ops"].list.s] if "fused_ops" in node.attr else []
            executed["+".join([node.op, *fused])] += 1
    traced = sum(1 for node in graph_def.node if node.op not in PLUMBING)
    return traced, executed


def onnx_counts(path):
    import onnx

    return collections.Counter(node.op_type for node in onnx.load(path).graph.node)


def onnx_runtime_counts(path, workdir):
    """The nodes ONNX Runtime runs: its optimised graph (fusions applied), as it saves it."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = os.path.join(workdir, "optimized-" + os.path.basename(path))
    onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return onnx_counts(options.optimized_model_filepath)


def openvino_counts(path, precision, profile_seconds, feed):
    """Executed layers of OpenVINO's CPU plugin: by type, in bf16, Reorders; time shares if profiled."""
    import time

    import openvino

    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": 2, "PERF_COUNT": True}
    compiled = openvino.Core().compile_model(path, "CPU", config)
    layers = collections.Counter()
    bf16 = collections.Counter()
    shapes = {}  # layer name -> its inputs' shapes, to tell apart layers of one type
    for operation in compiled.get_runtime_model().get_ordered_ops():
        shapes[operation.get_friendly_name()] = " × ".join(
            str(operation.input(index).get_partial_shape()) for index in range(operation.get_input_size()))
        info = {key: value.astype(str) for key, value in operation.get_rt_info().items()}
        layer_type = info.get("layerType", operation.get_type_name())
        if layer_type in ("Input", "Output", "Parameter", "Result", "Const"):
            continue
        layers[layer_type] += 1
        if "bf16" in info.get("runtimePrecision", "").lower():
            bf16[layer_type] += 1
    result = {"executed": sum(layers.values()), "by_type": dict(layers.most_common()),
              "bf16_by_type": dict(bf16.most_common()), "reorders": layers.get("Reorder", 0)}
    if profile_seconds:
        request = compiled.create_infer_request()
        shares, by_shape, calls = collections.Counter(), collections.Counter(), 0
        deadline = time.perf_counter() + profile_seconds
        while time.perf_counter() < deadline:
            request.infer(feed)
            calls += 1
            for node in request.profiling_info:
                kind = f"{node.node_type} ({node.exec_type})"
                shares[kind] += node.real_time.total_seconds()
                by_shape[f"{kind} {shapes.get(node.node_name, '?')}"] += node.real_time.total_seconds()
        total = sum(shares.values())
        result["time_share_by_type"] = {name: round(value / total, 4) for name, value in shares.most_common(20)}
        # ms per call of each layer type, kernel and input shapes, summed over the layers that share them
        result["ms_per_call_by_shape"] = {name: round(1e3 * value / calls, 2) for name, value in by_shape.most_common(20)}
        result["ms_per_call"] = round(1e3 * total / calls, 2)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="XXS24", help="XXS24, S24, ... or smoke (the benchmark's tiny model)")
    parser.add_argument("--profile-seconds", type=float, default=0.0,
                        help="run each OpenVINO model this long with performance counters (batch 1)")
    parser.add_argument("--output", help="write the counts as JSON here")
    args = parser.parse_args()

    import numpy as np
    import timm  # noqa: F401  before TensorFlow (their LLVM copies clash otherwise)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    spec = _spec(args.variant)
    counts = {"variant": args.variant}
    with tempfile.TemporaryDirectory() as workdir:
        save_random_checkpoint(spec, workdir)
        timm_onnx = export_timm_onnx(spec, workdir, os.path.join(workdir, "timm.onnx"))

        from keras_cait.export import export_onnx, export_openvino
        from keras_cait.export.inference_graph import InferenceGraph

        model = _keras_model(spec, workdir)
        image_shape = tuple(model.inputs[0].shape[1:])
        for name, function in (("folded inference graph", InferenceGraph(model)),
                               ("Keras model", lambda images: model(images, training=False))):
            traced, executed = tensorflow_counts(function, image_shape)
            counts[f"tensorflow {name}"] = {"traced": traced, "executed": sum(executed.values()),
                                            "executed_by_op": dict(executed.most_common())}
        ours_onnx = export_onnx(model, os.path.join(workdir, "keras_cait.onnx"))
        ours_openvino = export_openvino(model, os.path.join(workdir, "keras_cait.xml"))
        for name, path in (("keras_cait", ours_onnx), ("timm", timm_onnx)):
            nodes, executed = onnx_counts(path), onnx_runtime_counts(path, workdir)
            counts[f"onnx {name}"] = {"nodes": sum(nodes.values()), "by_op": dict(nodes.most_common()),
                                      "onnx_runtime": sum(executed.values()),
                                      "onnx_runtime_by_op": dict(executed.most_common())}
        pixels = np.random.RandomState(0).randint(0, 256, (1, *image_shape)).astype("float32")
        normalised = np.zeros((1, image_shape[2], *image_shape[:2]), "float32")
        for precision in ("f32", "bf16"):
            for name, path, feed in (("keras_cait", ours_openvino, pixels), ("timm", timm_onnx, normalised)):
                counts[f"openvino {precision} {name}"] = openvino_counts(path, precision, args.profile_seconds, feed)

    print(f"{args.variant}: TensorFlow ops (traced / executed after Grappler), ONNX nodes, OpenVINO executed layers")
    for name, value in counts.items():
        if name == "variant":
            continue
        headline = {key: value[key] for key in ("traced", "executed", "nodes", "onnx_runtime", "reorders")
                    if key in value}
        print(f"  {name}: {headline}")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(counts, file, indent=1)


if __name__ == "__main__":
    sys.exit(main())
