"""A roofline of one CaiT training step on the JAX backend, read from XLA's compiled program.

    python -m benchmarks.roofline --output roofline_s24.json     # CaiT-S24, batch 128
    python -m benchmarks.roofline --smoke
    python -m benchmarks.roofline --cpu --batch 16 --precision float32   # this CPU's peaks
    python -m benchmarks.roofline --profile 5     # on a GPU: each instruction's time beside its bound

Compiles, without running it, the step that benchmarks/training.py times: forward + backward
+ DeiT's AdamW of a CaiT at 224 under `mixed_bfloat16`, drop path 0.1, cross-entropy on
logits; the optimizer's update sits in a `jax.named_scope("optimizer")`. It then reads the
optimised HLO that XLA compiled for JAX's default device: each instruction of the entry
computation (a fusion, a matmul, a copy, ...) reads its operands from memory and writes its
result, so its bytes are their sizes; its FLOPs are 2·M·N·K for each dot or convolution inside
it and one per element for the other arithmetic. Each instruction is classed by the Keras layer
in its `op_name` (the layer of its matmul, for a fusion that has one; casts, copies and
transposes that carry no name go with the layer that produced their input, else with the one
that takes their output):

- linear layers: qkv, query/key/value, output projections, the MLP, the patch embedding, the head;
- talking-heads attention: the self-attention blocks' attention between qkv and its projection;
- class attention: likewise in the class-attention blocks;
- norms, GELU, LayerScale, residual adds and drop path: the rest of the blocks and the final norm;
- optimizer; other (the loss, the embeddings, copies that carry no layer's name).

For each class, the time an H100 SXM needs at its peaks: FLOPs / 989.4 TFLOP/s (dense bf16)
and bytes / 3.35 TB/s (HBM3), and the larger of the two. Other peaks: `--peak-tflops` and
`--peak-gbps`, or `--cpu`, which measures this CPU's: the fp32 matmul ceiling of the training
benchmark (benchmarks/harness.py, the faster of oneDNN and MKL, best of 5) and the bandwidth
of a 512 MB array copy (bytes read + written, best of 5). `--precision` (default
`mixed_bfloat16`) is the step's Keras policy: float32 on a CPU without bfloat16 units. The sums are checked against XLA's own
cost analysis of the whole program (`compiled.cost_analysis()`). The fusions, and so the bytes,
are those of the device that compiled: on a CPU, XLA:CPU's, which fuses less than XLA:GPU; the
FLOPs do not depend on it.

`--profile STEPS` also runs the step on the machine's own device: the median of STEPS timed
steps, then STEPS more under JAX's profiler, whose events name the instruction each kernel (on a
GPU) or thunk (XLA:CPU) ran for (`hlo_op`). Each instruction's time per step goes to its class,
beside the bound (`measured_ms`); `profile.slowest` lists the slowest instructions with their
bytes and FLOPs, and `unmatched_ms` what ran outside the entry computation's instructions. On a
GPU, XLA's CUDA graphs are turned off so that each kernel is seen on its own. `--attention`
defaults to what the layer runs on the device: the fused kernels on a GPU, keras.ops elsewhere.
"""

import argparse
import collections
import math
import os
import re

import numpy as np

from benchmarks.harness import print_result

PEAK_FLOPS = 989.4e12  # H100 SXM, dense bf16
PEAK_BYTES = 3.35e12  # H100 SXM, HBM3
CLASSES = ["linear layers", "talking-heads attention", "class attention",
           "norms, GELU, LayerScale, residual, drop path", "optimizer", "other"]
LINEAR = ("/qkv/", "/query/", "/key/", "/value/", "/output_projection/", "/mlp_dense_1/", "/mlp_dense_2/",
          "patch_embedding", "predictions")
ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
              "s64": 8, "u64": 8, "f64": 8}
NO_MEMORY = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "after-all", "partition-id",
             "replica-id"}
ARITHMETIC = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential", "exponential-minus-one",
              "log", "log-plus-one", "rsqrt", "sqrt", "tanh", "erf", "negate", "power", "select", "compare", "abs",
              "convert", "logistic", "cbrt", "sign", "floor", "ceil", "round-nearest-even", "and", "or", "xor",
              "not", "clamp", "atan2", "remainder", "sine", "cosine"}
ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*)$")


def op_class(op_name):
    """The class of an `op_name` such as `jit(step)/transpose(jvp(self_attention_block_3))/attention/qkv/dot_general`."""
    if "optimizer" in op_name:
        return "optimizer"
    if any(linear in op_name for linear in LINEAR):
        return "linear layers"
    if "self_attention_block" in op_name and "/attention/" in op_name:
        return "talking-heads attention"
    if "class_attention_block" in op_name and "/attention/" in op_name:
        return "class attention"
    if "_block_" in op_name or "final_norm" in op_name:
        return "norms, GELU, LayerScale, residual, drop path"
    return "other"


def shape_bytes(shape):
    return sum(ITEM_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in ARRAY.findall(shape))


def elements(shape):
    return sum(math.prod(int(d) for d in dims.split(",") if d) for _, dims in ARRAY.findall(shape))


def dims(shape):
    return [int(d) for d in ARRAY.search(shape).group(2).split(",") if d]


def library_call(attributes):
    """The target of a custom-call (`__cublas$lt$matmul`, `__cudnn$convForward`, a Pallas kernel's), else ""."""
    target = re.search(r'custom_call_target="([^"]+)"', attributes)
    return target.group(1) if target else ""


def result_bytes(shape, opcode, attributes):
    """Bytes an instruction writes: cuBLAS and cuDNN calls also return a scratch workspace, left out."""
    if opcode == "custom-call" and library_call(attributes).startswith(("__cublas", "__cudnn")):
        dtype, sizes = ARRAY.search(shape).groups()
        return ITEM_BYTES[dtype] * math.prod(int(d) for d in sizes.split(",") if d)
    return shape_bytes(shape)


def split_instruction(text):
    """`shape opcode(operands), attributes` -> (shape, opcode, [operand names], attributes)."""
    if text.startswith("("):  # a tuple shape
        depth = 0
        for end, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
        shape, rest = text[:end + 1], text[end + 2:]
    else:
        shape, rest = text.split(" ", 1)
    opcode, rest = rest.split("(", 1)
    depth, end = 1, 0
    for end, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            break
    operands = re.findall(r"%([\w.\-]+)", rest[:end])
    return shape, opcode, operands, rest[end + 1:]


def parse_module(text):
    """{computation: [(name, shape, opcode, operands, attributes)]} and the entry computation's name."""
    computations, entry, current = {}, None, None
    for line in text.splitlines():
        header = re.match(r"^(ENTRY )?%(\S+) \(", line)
        if header and line.rstrip().endswith("{"):
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
        elif line.startswith("}"):
            current = None
        elif current is not None:
            match = INSTRUCTION.match(line)
            if match:
                computations[current].append((match.group(1), *split_instruction(match.group(2))))
    return computations, entry


def flops_and_names(computations, name):
    """FLOPs of a computation (recursing into fusions) and the op_names of its dots/convolutions and others."""
    shapes = {instruction[0]: instruction[1] for instruction in computations[name]}
    flops, matmul_names, names = 0, [], []
    for _, shape, opcode, operands, attributes in computations[name]:
        op_name = re.search(r'op_name="([^"]+)"', attributes)
        if op_name:
            names.append(op_name.group(1))
        if opcode == "dot":
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attributes).group(1)
            lhs = dims(shapes[operands[0]])
            flops += 2 * elements(shape) * math.prod(lhs[int(d)] for d in contracting.split(",") if d)
            matmul_names += [op_name.group(1)] if op_name else []
        elif opcode == "convolution":
            rhs_labels = re.search(r"dim_labels=\w+_(\w+)->", attributes).group(1)
            kernel = dims(shapes[operands[1]])
            flops += 2 * elements(shape) * math.prod(kernel) // kernel[rhs_labels.index("o")]
            matmul_names += [op_name.group(1)] if op_name else []
        elif opcode == "custom-call" and library_call(attributes).startswith("__cublas"):
            # XLA:GPU's matmuls in cuBLAS: (result, workspace) = custom-call(lhs, rhs[, bias]).
            contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', attributes).group(1)
            lhs = dims(shapes[operands[0]])
            flops += 2 * math.prod(dims(shape)) * math.prod(lhs[int(d.strip('" '))] for d in contracting.split(",")
                                                             if d.strip('" '))
            matmul_names += [op_name.group(1)] if op_name else []
        elif opcode == "custom-call" and library_call(attributes).startswith("__cudnn$conv"):
            rhs_labels = re.search(r"dim_labels=\w+_(\w+)->", attributes).group(1)
            kernel = dims(shapes[operands[1]])
            flops += 2 * math.prod(dims(shape)) * math.prod(kernel) // kernel[rhs_labels.index("o")]
            matmul_names += [op_name.group(1)] if op_name else []
        elif opcode in ARITHMETIC:
            flops += elements(shape)
        elif opcode == "reduce":
            flops += elements(shapes[operands[0]])
        called = re.search(r"calls=%([\w.\-]+)", attributes)
        if opcode == "fusion" and called:
            inner_flops, inner_matmuls, inner_names = flops_and_names(computations, called.group(1))
            flops, matmul_names, names = flops + inner_flops, matmul_names + inner_matmuls, names + inner_names
    return flops, matmul_names, names


def instructions(hlo_text):
    """The entry computation's instructions that touch memory, as {name: (class, label, FLOPs, bytes)}."""
    computations, entry = parse_module(hlo_text)
    shapes = {instruction[0]: instruction[1] for instruction in computations[entry]}
    records, labels, consumers = [], {}, collections.defaultdict(list)
    for name, shape, opcode, operands, attributes in computations[entry]:
        for operand in operands:
            consumers[operand].append(name)
        if opcode in NO_MEMORY:
            continue
        own = re.search(r'op_name="([^"]+)"', attributes)
        called = re.search(r"calls=%([\w.\-]+)", attributes)
        if opcode == "fusion" and called:
            flops, matmul_names, names = flops_and_names(computations, called.group(1))
        else:  # the instruction alone, its operands as parameters
            alone = [(o, shapes[o], "parameter", [], "") for o in operands if o in shapes]
            flops, matmul_names, names = flops_and_names({"": alone + [(name, shape, opcode, operands, attributes)]}, "")
        label = (matmul_names or ([own.group(1)] if own else []) or names or [None])[0]
        if label:
            labels[name] = label
        size = result_bytes(shape, opcode, attributes) + sum(shape_bytes(shapes[o]) for o in operands if o in shapes)
        records.append((name, opcode, operands, flops, size))
    # Casts, copies and transposes that XLA emitted without a layer's name go with the layer that
    # produced their input, else with the one that takes their output.
    for _ in range(len(records)):
        unlabeled = [record for record in records if record[0] not in labels]
        for name, _, operands, _, _ in unlabeled:
            near = [labels[o] for o in operands if o in labels] + [labels[c] for c in consumers[name] if c in labels]
            if near:
                labels[name] = near[0]
        if len(unlabeled) == len([record for record in records if record[0] not in labels]):
            break
    table = {}
    for name, opcode, _, flops, size in records:
        label = labels.get(name, "")
        table[name] = (op_class(label), re.sub(r"^jit\([^)]*\)/", "", label) or opcode, flops, size)
    return table


def roofline(program, peak_flops=PEAK_FLOPS, peak_bytes=PEAK_BYTES):
    """Per class of the program's `instructions`: FLOPs, bytes, instructions, the time at the peaks
    (FLOP/s, bytes/s) and the heaviest op_names."""
    rows = {name: collections.Counter() for name in CLASSES}
    heaviest = {name: collections.Counter() for name in CLASSES}
    for kind, label, flops, size in program.values():
        rows[kind]["flops"] += flops
        rows[kind]["bytes"] += size
        rows[kind]["instructions"] += 1
        heaviest[kind][label] += size
    table = {}
    for name, row in rows.items():
        compute, memory = row["flops"] / peak_flops, row["bytes"] / peak_bytes
        table[name] = dict(flops=row["flops"], bytes=row["bytes"], instructions=row["instructions"],
                           compute_ms=compute * 1e3, memory_ms=memory * 1e3, bound_ms=max(compute, memory) * 1e3,
                           heaviest_bytes=dict(heaviest[name].most_common(4)))
    return table


def training_step(config, batch, image_size, classes, precision="mixed_bfloat16", device=None):
    """The compiled step (forward + backward + AdamW) of a CaiT under the `precision` policy, for
    JAX's default device or `device` (a compile-only GPU of benchmarks/gpu_compile.py), and a
    function that gives its arguments (the model's variables, random images and labels) to run it."""
    import jax
    import jax.numpy as jnp
    import keras

    from benchmarks.training import DROP_PATH_RATE, LEARNING_RATE
    from keras_cait.models.architecture import build_cait
    from keras_cait.training import adamw

    keras.mixed_precision.set_global_policy(precision)
    model = build_cait(**config, input_shape=(image_size, image_size, 3), classes=classes,
                       classifier_activation=None, drop_path_rate=DROP_PATH_RATE)
    optimizer = adamw(model, LEARNING_RATE)
    optimizer.build(model.trainable_variables)
    loss = keras.losses.CategoricalCrossentropy(from_logits=True)

    def step(trainable, non_trainable, optimizer_variables, images, labels):
        def loss_of(trainable):
            logits, updated = model.stateless_call(trainable, non_trainable, images, training=True)
            return loss(labels, logits), updated

        (value, non_trainable), gradients = jax.value_and_grad(loss_of, has_aux=True)(trainable)
        with jax.named_scope("optimizer"):
            trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, gradients, trainable)
        return value, trainable, non_trainable, optimizer_variables

    placed = {} if device is None else {"sharding": jax.sharding.SingleDeviceSharding(device)}

    def like(variables):
        return [jax.ShapeDtypeStruct(v.shape, v.dtype, **placed) for v in variables]

    arguments = (like(model.trainable_variables), like(model.non_trainable_variables), like(optimizer.variables),
                 jax.ShapeDtypeStruct((batch, image_size, image_size, 3), jnp.float32, **placed),
                 jax.ShapeDtypeStruct((batch, classes), jnp.float32, **placed))
    compiled = jax.jit(step, donate_argnums=(0, 1, 2)).lower(*arguments).compile()

    def values(seed=0):
        random = np.random.default_rng(seed)
        images = random.uniform(0, 255, (batch, image_size, image_size, 3)).astype("float32")
        labels = np.eye(classes, dtype="float32")[random.integers(0, classes, batch)]
        copies = [[jnp.array(v.value, copy=True) for v in variables]  # the step takes them over
                  for variables in (model.trainable_variables, model.non_trainable_variables, optimizer.variables)]
        return (*copies, jnp.asarray(images), jnp.asarray(labels))

    return compiled, values


def instruction_times(events, steps, module="jit_step"):
    """Milliseconds per step of each instruction of the compiled `module`, from a profile's
    events, (plane name, duration in ns, {stat: value}): XLA names the instruction each event ran
    in its `hlo_op` stat. A GPU's own planes (its kernels) when the profile has them, else the
    host's (XLA:CPU's thunks)."""
    events = list(events)
    device = any(plane.startswith("/device:GPU") for plane, _, _ in events)
    times = collections.Counter()
    for plane, duration, stats in events:
        if plane.startswith("/device:GPU" if device else "/host:CPU") and stats.get("hlo_module") == module \
                and "hlo_op" in stats:
            times[stats["hlo_op"]] += duration / 1e6 / steps
    return dict(times)


def profile_step(compiled, arguments, steps):
    """The step's median time in ms over `steps` runs, then each instruction's ms per step under JAX's profiler."""
    import glob
    import statistics
    import tempfile
    import time

    import jax
    from jax.profiler import ProfileData

    state, batch = list(arguments[:3]), arguments[3:]

    def run():
        _, *state[:] = compiled(*state, *batch)
        jax.block_until_ready(state)

    for _ in range(2):  # the first runs compile nothing more but allocate
        run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory)
        for _ in range(steps):
            run()
        jax.profiler.stop_trace()
        data = ProfileData.from_file(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0])
        events = [(plane.name, event.duration_ns, dict(event.stats))
                  for plane in data.planes for line in plane.lines for event in line.events]
    return statistics.median(times) * 1e3, instruction_times(events, steps)


def measured(table, times, step_ms, top=15):
    """The profile beside the roofline: each class's measured ms per step, what ran outside the
    entry computation's instructions, and the slowest instructions."""
    classes = collections.Counter()
    for name, ms in times.items():
        classes[table[name][0] if name in table else "unmatched"] += ms
    slowest = sorted((name for name in times if name in table), key=times.get, reverse=True)[:top]
    return {
        "step_ms": step_ms, "instructions_ms": sum(times.values()), "unmatched_ms": classes.pop("unmatched", 0.0),
        "classes": dict(classes),
        "slowest": [dict(instruction=name, label=table[name][1], measured_ms=times[name],
                         bytes=table[name][3], flops=table[name][2]) for name in slowest],
    }


def cpu_peaks(repeats=5):
    """(FLOP/s, bytes/s) of this CPU: the training benchmark's fp32 matmul ceiling, and a copy's bandwidth."""
    import time

    import numpy as np

    from benchmarks.harness import matmul_ceiling

    ceiling = matmul_ceiling()
    flops = max(ceiling(None) for _ in range(repeats)) * 1e9
    source = np.ones(128 * 2**20, np.float32)  # 512 MB: no cache holds it
    target = np.empty_like(source)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return flops, 2 * source.nbytes / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="S24", choices=["S24", "XXS24"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--smoke", action="store_true", help="a 1-block CaiT at 32x32, batch 2")
    parser.add_argument("--precision", default="mixed_bfloat16", choices=["mixed_bfloat16", "float32"],
                        help="the step's Keras dtype policy")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_FLOPS / 1e12,
                        help="peak TFLOP/s of the precision's matmuls (default: an H100 SXM's dense bf16)")
    parser.add_argument("--peak-gbps", type=float, default=PEAK_BYTES / 1e9,
                        help="peak memory bandwidth in GB/s (default: an H100 SXM's HBM3)")
    parser.add_argument("--cpu", action="store_true",
                        help="compile for the CPU and measure its peaks (overrides --peak-tflops/--peak-gbps)")
    parser.add_argument("--gpu-target", action="store_true",
                        help="compile for an H100 without a GPU (benchmarks/gpu_compile.py): XLA:GPU's program")
    parser.add_argument("--attention", choices=["keras-ops", "fused"],
                        help="the self-attention's keras.ops path or the fused Pallas kernels (default: what "
                             "the layer runs on the device, fused on a GPU; fused without one needs --gpu-target)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also run the step and time each instruction under JAX's profiler over STEPS steps")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.cpu and args.gpu_target:
        parser.error("--cpu and --gpu-target: choose one")
    if args.profile < 0 or (args.profile and args.gpu_target):
        parser.error(f"--profile {args.profile}: a number of steps (1 or more) to run on this machine's own "
                     "device; --gpu-target's H100 runs nothing")
    if args.gpu_target:
        from benchmarks import gpu_compile

        gpu_compile.prepare_environment()
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    if args.profile:
        # Each kernel timed as its own instruction, not inside a CUDA graph of many.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax

    from keras_cait.layers.talking_heads_attention import FUSED_ATTENTION_VARIABLE

    on_gpu = jax.default_backend() == "gpu"
    if args.attention == "fused" and not (args.gpu_target or on_gpu):
        parser.error("--attention fused runs the Pallas kernels on a GPU: give --gpu-target to compile for one")
    attention = args.attention or ("fused" if on_gpu else "keras-ops")
    if attention == "keras-ops":
        os.environ[FUSED_ATTENTION_VARIABLE] = "0"

    from benchmarks.training import SMOKE, SMOKE_CLASSES, VARIANTS

    if args.smoke:
        config, batch, image_size, classes = dict(SMOKE), 2, 32, SMOKE_CLASSES
    else:
        config = {k: v for k, v in VARIANTS[args.variant].items() if k != "timm"}
        batch, image_size, classes = args.batch, 224, 1000
    peaks = cpu_peaks() if args.cpu else (args.peak_tflops * 1e12, args.peak_gbps * 1e9)
    device = gpu_compile.h100() if args.gpu_target else None
    if attention == "fused" and args.gpu_target:
        # The layer runs the kernels where JAX's default device is a GPU; here it is the CPU
        # that compiles for one.
        from keras_cait.kernels import talking_heads_pallas

        talking_heads_pallas.on_gpu = lambda: True
    compiled, values = training_step(config, batch, image_size, classes, args.precision, device)
    hlo = compiled.as_text()
    program = instructions(hlo)
    table = roofline(program, *peaks)
    analysis = compiled.cost_analysis()
    analysis = (analysis[0] if isinstance(analysis, list) else analysis) or {}  # none for a compile-only device
    result = {
        "model": "smoke" if args.smoke else args.variant, "batch": batch, "image_size": image_size,
        "precision": args.precision,
        "array_dtypes": sorted({dtype for dtype, _ in ARRAY.findall(hlo) if dtype in ITEM_BYTES}),
        "device": f"{device.device_kind} (compile-only)" if device else jax.devices()[0].device_kind,
        "attention": attention, "jax": jax.__version__,
        "peaks": {"tflops": peaks[0] / 1e12, "gbps": peaks[1] / 1e9, "measured": args.cpu}, "classes": table,
        "total": {key: sum(row[key] for row in table.values()) for key in ("flops", "bytes", "bound_ms")},
        "xla_cost_analysis": {"flops": analysis.get("flops"), "bytes": analysis.get("bytes accessed")},
    }
    if args.profile:
        step_ms, times = profile_step(compiled, values(), args.profile)
        result["profile"] = {"steps": args.profile, **measured(program, times, step_ms)}
        for name, row in table.items():
            row["measured_ms"] = result["profile"]["classes"].get(name, 0.0)
    return print_result(result, args.output)


if __name__ == "__main__":
    main()
