"""The interleaved benchmark harness that benchmarks.inference, .training and .input share.

Ratios between frameworks are only meaningful if they share the machine's state:
torch's OpenMP threads collapse when anything else runs, TensorFlow's less so. So
every path gets one persistent worker process, all workers are loaded (and
warmed up) first, then they are timed in turns: round after round, each path
runs for a number of seconds while the others wait, in an order rotated every
round. The machine's fp32 matmul ceiling is one more worker timed in the same
turns, so "% of ceiling" compares like with like.

A benchmark module runs itself as a worker (`python -m benchmarks.MODULE --worker PATH ...`,
with the repository root put first on the worker's PYTHONPATH, so that it finds the module and
this checkout's keras_cait from any working directory); the
worker builds its `run(inputs)` and hands it to `serve`, which warms it up,
reports ready, then answers the parent's "time" requests on its stdout. The
parent side is `Worker` (one process) and `timed_rounds` (the turns).
"""

import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

CEILING = "matmul-ceiling"


def peak_memory_mb():
    """The largest resident set of this process and of its finished children, in MB.

    Children count because torch.compile compiles in subprocesses.
    """
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024  # ru_maxrss is in KB on Linux


def matmul_ceiling():
    """fp32 GEMM, n=2048, by TensorFlow (oneDNN) and torch (MKL): the faster is the ceiling.

    Returns `run(_) -> GFLOP/s`, as `serve` times the ceiling worker.
    """
    import numpy as np
    import tensorflow as tf
    import torch

    n = 2048
    a = np.random.RandomState(0).normal(size=(n, n)).astype("float32")
    tf_a, torch_a = tf.constant(a), torch.from_numpy(a)
    tf_matmul = tf.function(lambda x: tf.matmul(x, x))

    def run(_):
        best = math.inf
        for call in (lambda: tf_matmul(tf_a).numpy(), lambda: torch.mm(torch_a, torch_a).numpy()):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        return 2 * n**3 / best / 1e9

    return run


# === Worker side: one path, answering "time" requests ===


def protocol_channel():
    """The worker's stdout for replies; whatever a library prints goes to the log (stderr) instead."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return channel


def serve(channel, run, inputs, ceiling=False, outputs=True, warmups=2, started=None, pipeline=None, levers=None):
    """Warms `run` up on every batch, reports ready, then times it on each request.

    Args:
        channel: from `protocol_channel()`.
        run: `run(inputs[batch]) -> numpy array` (outputs, or a loss), or for
            the ceiling `run(None) -> GFLOP/s`.
        inputs: {batch: what `run` takes}.
        outputs: send each batch's warm-up result in the ready message
            (the parent compares them between paths).
        started: `time.perf_counter()` when loading began (load_seconds).
        pipeline: for input pipelines, instead of `run`: `pipeline() -> next_batch`,
            a fresh pipeline. Each turn starts one, takes its first batch untimed,
            then counts the batches of the turn (all of them over the turn's time,
            not the median batch: a pipeline's batches come in bursts) and drops
            it, so that no pipeline works ahead while another worker is timed.
        levers: `levers() -> dict`, what the worker observes of its speed levers
            once warmed up (the dtype it computes in, what XLA compiled); sent
            as "levers" in the ready message, so that a lever whose flag did not
            apply shows instead of being timed as the path without it.
    """
    start = time.perf_counter() if started is None else started
    results = {}
    if pipeline is not None:
        for _ in range(warmups):
            _pipeline_turn(pipeline, 0.0)
    elif not ceiling:
        for batch in inputs:  # compiles, traces and warms up every shape before any timing
            for _ in range(warmups):
                results[batch] = run(inputs[batch])
    ready = {"load_seconds": time.perf_counter() - start, "peak_memory_mb": peak_memory_mb()}
    if outputs and not ceiling:
        ready["outputs"] = {batch: results[batch].tolist() for batch in inputs}
    if levers is not None:
        ready["levers"] = levers()
    channel.write(json.dumps(ready) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if ceiling:
            rates = [run(None) for _ in range(3)]
            channel.write(json.dumps({"gflops": max(rates)}) + "\n")
            continue
        if pipeline is not None:
            calls, seconds = _pipeline_turn(pipeline, request["seconds"])
            channel.write(json.dumps({"images_per_second": request["batch"] * calls / seconds, "calls": calls,
                                      "peak_memory_mb": peak_memory_mb()}) + "\n")
            continue
        batch, times = request["batch"], []
        deadline = time.perf_counter() + request["seconds"]
        while time.perf_counter() < deadline or len(times) < 2:
            begin = time.perf_counter()
            run(inputs[batch])
            times.append(time.perf_counter() - begin)
        channel.write(json.dumps({"images_per_second": batch / statistics.median(times), "calls": len(times),
                                  "peak_memory_mb": peak_memory_mb()}) + "\n")


def _pipeline_turn(pipeline, seconds):
    """One turn of a fresh pipeline: (batches after the first, their seconds); the pipeline is then dropped."""
    next_batch = pipeline()
    next_batch()  # starts workers, fills shuffle buffers: not timed
    calls, begin = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - begin < seconds:
        next_batch()
        calls += 1
    elapsed = time.perf_counter() - begin
    del next_batch
    gc.collect()  # a tf.data iterator stops its threads, a DataLoader iterator its worker processes
    return calls, elapsed


# === Parent side: the workers and their turns ===


REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def with_repository(environment=None):
    """os.environ (and `environment`) with the repository root first on PYTHONPATH."""
    environment = {**os.environ, **(environment or {})}
    environment["PYTHONPATH"] = os.pathsep.join(
        [REPOSITORY, *[entry for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]])
    return environment


class Worker:
    """One worker process: `python -m module --worker PATH *arguments`, its stderr in `log`."""

    def __init__(self, module, path, arguments, log, environment=None):
        command = [sys.executable, "-m", module, "--worker", path, *arguments]
        self.path, self.log = path, log
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=open(log, "w"), text=True, bufsize=1,
                                        env=with_repository(environment))

    def read(self):
        line = self.process.stdout.readline()
        if not line:
            tail = open(self.log).read()[-3000:]
            raise RuntimeError(f"worker {self.path} died; the end of {self.log}:\n{tail}")
        return json.loads(line)

    def ask(self, **request):
        self.process.stdin.write(json.dumps(request) + "\n")
        return self.read()

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def load_all(workers, label):
    """Waits until every worker is ready (they load side by side); keeps each ready message."""
    for path, worker in workers.items():
        worker.ready = worker.read()
        print(f"  {label} {path}: loaded in {worker.ready['load_seconds']:.0f} s, "
              f"{worker.ready['peak_memory_mb']:.0f} MB", flush=True)


def timed_rounds(workers, paths, batches, rounds, seconds, label):
    """Times `paths` in turns, the ceiling worker (if any) first in each round, the order rotated every round.

    Returns ({(batch, path): [images/s per round]}, [ceiling GFLOP/s per round],
    {path: peak memory in MB}). The workers stay open for the caller to close.
    """
    speeds = {(batch, path): [] for batch in batches for path in paths}
    ceilings, memory = [], {path: workers[path].ready["peak_memory_mb"] for path in paths}
    order = list(paths)
    for round_index in range(rounds):
        if CEILING in workers:
            ceilings.append(workers[CEILING].ask()["gflops"])
        for batch in batches:
            for path in order:
                result = workers[path].ask(batch=batch, seconds=seconds)
                speeds[batch, path].append(result["images_per_second"])
                memory[path] = max(memory[path], result["peak_memory_mb"])
        order = order[1:] + order[:1]
        print(f"  {label} round {round_index + 1}/{rounds} done", flush=True)
    return speeds, ceilings, memory


def median_ratios(samples, reference):
    """The median over rounds of the per-round ratios: both timed in the same round."""
    return statistics.median(s / r for s, r in zip(samples, reference))


def machine_state(threads, rounds, seconds, load_average_start, started, packages):
    """What a run's figures depend on: cores, threads, turns, load average, versions."""
    import importlib.metadata

    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return dict(
        machine=platform.machine(), processor=platform.processor(), cores=os.cpu_count(), threads=threads,
        load_average_start=load_average_start, load_average_end=os.getloadavg(),
        wall_seconds=time.time() - started, rounds=rounds, seconds_per_turn=seconds,
        python=platform.python_version(), **versions,
    )


def write_json(value, path):
    """`value` as JSON at `path`, put in place whole."""
    with open(path + ".part", "w") as file:
        json.dump(value, file, indent=1)
    os.replace(path + ".part", path)


def print_result(result, output=None):
    """Prints `result` as indented JSON and, given a path, writes it there too; returns it."""
    text = json.dumps(result, indent=1)
    print(text)
    if output:
        with open(output, "w") as file:
            file.write(text + "\n")
    return result
