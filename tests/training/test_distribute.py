"""Distributed training: strategy choice, the cluster variables, what each process is fed, and
two processes on loopback (TF MultiWorkerMirroredStrategy, JAX across processes) that train as one.

"Train as one" is checked three ways, each run from the same command line: the two processes
end with the same weights; these equal, within float tolerance, the weights of one process
trained with the same global batch on the same data (`--strategy none`, the global batch as
`--batch-size`); and they differ from those of one process trained alone on process 0's
slice of each global batch, by far more than that tolerance (so the first two checks are not
passed by a training too short to tell runs apart).
"""

import json
import os
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_cait  # noqa: F401 (registers CaiTModel, which the .keras files name)
from keras_cait.cli import runs
from keras_cait.cli.errors import CommandFailed, flag_name
from keras_cait.errors import ArgumentError
from keras_cait.training import distribute

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_CAIT = '{"embed_dim": 32, "depth": 1, "num_heads": 2, "init_values": 0.1, "patch_size": 8}'
JAX_CLUSTER = {distribute.ADDRESSES: "127.0.0.1:1234", distribute.NUM_PROCESSES: "2",
               distribute.PROCESS_ID: "0"}


def test_strategy_errors_name_the_backend_and_the_fix_in_the_caller_s_words(monkeypatch):
    """Python reads `strategy='mirrored'`, the command `--strategy mirrored`, each once."""
    with pytest.raises(ArgumentError) as refused:
        distribute.distribution("horovod")
    assert str(refused.value) == "strategy='horovod': must be one of none, mirrored, multiworker, dataparallel"
    with pytest.raises(ArgumentError) as refused:
        distribute.distribution("dataparallel")
    assert str(refused.value) == ("strategy='dataparallel': needs the jax backend but Keras runs on tensorflow; "
                                  "set KERAS_BACKEND=jax or use strategy='mirrored' or strategy='multiworker'")
    assert refused.value.render(flag_name).endswith("use --strategy mirrored or --strategy multiworker")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ArgumentError, match="^strategy='multiworker': needs the TF_CONFIG environment variable"):
        distribute.distribution("multiworker")


@pytest.mark.parametrize("environ, names", [
    ({distribute.NUM_PROCESSES: "2", distribute.PROCESS_ID: "1"},
     ["KERAS_DISTRIBUTION_JOB_ADDRESSES not set", "set all three or none"]),
    ({distribute.ADDRESSES: "10.0.0.1:1234"},
     ["KERAS_DISTRIBUTION_NUM_PROCESSES, KERAS_DISTRIBUTION_PROCESS_ID not set", "set all three"]),
    ({**JAX_CLUSTER, distribute.NUM_PROCESSES: "two"}, ["KERAS_DISTRIBUTION_NUM_PROCESSES=two", "at least 1"]),
    ({**JAX_CLUSTER, distribute.PROCESS_ID: "2"}, ["KERAS_DISTRIBUTION_PROCESS_ID=2", "0 to 1"]),
    ({**JAX_CLUSTER, distribute.PROCESS_ID: "-1"}, ["KERAS_DISTRIBUTION_PROCESS_ID=-1", "0 to 1"]),
    ({**JAX_CLUSTER, distribute.ADDRESSES: "10.0.0.1"}, ["JOB_ADDRESSES=10.0.0.1", "not host:port"]),
    ({**JAX_CLUSTER, distribute.ADDRESSES: "a:1,b:2,c:3"}, ["3 addresses for 2 processes", "process 0's first"]),
])
def test_keras_distribution_variables_half_set_or_wrong_are_refused(environ, names):
    with pytest.raises(ValueError) as raised:
        distribute.jax_processes(environ)
    message = str(raised.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_keras_distribution_variables_read_as_keras_reads_them():
    assert distribute.jax_processes({}) is None
    assert distribute.jax_processes({**JAX_CLUSTER, distribute.ADDRESSES: "h0:1,h1:2"}) == \
        distribute.Processes("h0:1", 2, 0)
    assert distribute.jax_processes({**JAX_CLUSTER, distribute.PROCESS_ID: "1"}) == \
        distribute.Processes("127.0.0.1:1234", 2, 1)


def test_a_cluster_the_strategy_would_not_join_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    # The failure: each process of a cluster trained alone, all writing final.keras.
    monkeypatch.setenv(distribute.NUM_PROCESSES, "2")
    with pytest.raises(CommandFailed):
        runs.main("train", ["--data", str(tmp_path), "--output-dir", str(tmp_path / "run")])
    line = capsys.readouterr().err.strip()
    assert "\n" not in line
    assert line.startswith("keras-cait train: --strategy none: KERAS_DISTRIBUTION_NUM_PROCESSES=2") \
        and "only --strategy dataparallel" in line and line.count("--strategy none") == 1
    monkeypatch.delenv(distribute.NUM_PROCESSES)
    workers = {"cluster": {"worker": ["h0:1", "h1:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(workers))
    with pytest.raises(ArgumentError) as refused:
        distribute.distribution("mirrored")
    assert str(refused.value).startswith("strategy='mirrored': TF_CONFIG names a cluster of 2 workers, which only "
                                         "strategy='multiworker' joins")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["h0:1"]}, "task": {"type": "chief"}}))
    assert distribute.distribution("none").is_chief  # a one-task TF_CONFIG (Vertex AI sets one) is no cluster


def _fed(data_parallel, dataset, process, processes=2):
    """What Keras feeds process `process` of `processes` from `dataset` (the per-process
    batches, as lists): `distribute_dataset` as it runs in that process, whose count and
    index JAX gives it there."""
    data_parallel._num_processes, data_parallel._process_id = processes, process
    data_parallel._is_multi_process = processes > 1
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), batch)
            for batch in data_parallel.distribute_dataset(dataset)]


def test_each_process_is_fed_its_slice_of_every_global_batch():
    data_parallel = distribute._data_parallel(devices=["cpu:0", "cpu:1"])  # one device per process
    # Global batches of 4 (the training stream's: a static batch size).
    rows = tf.data.Dataset.range(12).map(lambda i: (tf.fill([2], i), tf.one_hot(i % 3, 3)))
    train = rows.batch(4, drop_remainder=True)
    firsts = [[[int(r[0]) for r in x] for x, _ in _fed(data_parallel, train, p)] for p in (0, 1)]
    assert firsts == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]
    assert _fed(data_parallel, train, 0, processes=1) == [(x.numpy().tolist(), y.numpy().tolist())
                                                         for x, y in train]
    # An evaluation set of 10 in batches of 4: the last batch (8, 9) is filled up with rows of
    # weight 0, so that both processes have 3 batches (with 2 and 3 they would wait forever).
    evaluation = rows.take(10).batch(4)
    fed = [_fed(data_parallel, evaluation, p) for p in (0, 1)]
    assert [len(batches) for batches in fed] == [3, 3]
    assert [[int(r[0]) for r in x] for x, _, _ in fed[0]] == [[0, 1], [4, 5], [8, 9]]
    assert [[int(r[0]) for r in x] for x, _, _ in fed[1]] == [[2, 3], [6, 7], [0, 0]]
    assert [w for _, _, w in fed[1]] == [[1, 1], [1, 1], [0, 0]]
    assert fed[1][2][1] == [[0, 0, 0], [0, 0, 0]]


def test_one_device_and_mirrored_scale_the_global_batch():
    assert distribute.distribution("none").global_batch_size(64) == 64
    mirrored = distribute.distribution("mirrored")  # one CPU replica here, N GPUs there
    assert mirrored.global_batch_size(64) == 64 * mirrored.replicas
    with mirrored.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert "Mirrored" in type(model.weights[0].value).__name__


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


# One process, from the same command line: alone with `--batch-size` as its global batch
# ("all"), or alone on process I of N's slice of each global batch ("I/N"), cut as Keras
# (`Distribution.distribute_dataset`) and tf.distribute (DATA sharding) cut it.
ALONE = """
import sys
from keras_cait.cli import runs
from keras_cait.training import stream
if sys.argv[1] != "all":
    index, count = map(int, sys.argv[1].split("/"))
    whole = stream.training_stream
    def shard(source, augmentation, batch_size, *args, **kwargs):
        batches = whole(source, augmentation, batch_size, *args, **kwargs)
        return batches.rebatch(batch_size // count).shard(count, index)
    stream.training_stream = shard
runs.main("train", sys.argv[2:])
"""
# Equal within float tolerance (measured: 3e-8 TF, 6e-8 JAX), different by far more (2e-3).
SAME, DIFFERENT = 1e-6, 1e-4


def tiny_run(data_dir, output_dir, strategy, batch_size, *extra):
    """A few steps of a tiny CaiT, deterministic: no RandAugment (Keras' stateful draws) and
    no stochastic depth (the model's draws); cropping, flips, mixup, cutmix and erasing stay,
    being functions of (seed, step, position) applied to global batches before they are cut."""
    return ["--model", TINY_CAIT, "--data", data_dir, "--output-dir", str(output_dir),
            "--strategy", strategy, "--batch-size", str(batch_size), "--image-size", "32",
            "--precision", "float32", "--epochs", "2", "--warmup-epochs", "1", "--lr", "0.05",
            "--randaugment", "0", "--repeated-aug", "1", "--drop-path", "0", "--verbose", "2", *extra]


def run_together(environments, argv, timeout=420):
    """Runs `python -m keras_cait.cli train ARGV` once per environment, all at once; returns their outputs."""
    processes = [subprocess.Popen([sys.executable, "-m", "keras_cait.cli", "train", *argv], env=environment, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for environment in environments]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        left = [process.communicate()[0] for process in processes[len(outputs):]]
        pytest.fail(f"the processes did not end within {timeout} s (one waiting for another?):\n"
                    + "\n---\n".join(outputs + left))
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output
    return outputs


def run_alone(environment, which, argv):
    done = subprocess.run([sys.executable, "-c", ALONE, which, *argv], env=environment,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def weights(path):
    return [np.array(weight) for weight in keras.models.load_model(path).weights]


def largest_difference(a, b):
    assert [w.shape for w in a] == [w.shape for w in b]
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def assert_trained_as_one(output_dir, one_process, alone_on_shard):
    """The three-way check of the module docstring; the other process's files are its own."""
    trained = weights(os.path.join(output_dir, "final.keras"))
    other = weights(os.path.join(output_dir, "workers", "1", "final.keras"))
    for a, b in zip(trained, other):
        np.testing.assert_array_equal(a, b)
    one = weights(os.path.join(one_process, "final.keras"))
    alone = weights(os.path.join(alone_on_shard, "final.keras"))
    assert largest_difference(trained, one) <= SAME
    assert largest_difference(alone, one) > DIFFERENT
    assert sorted(os.listdir(os.path.join(output_dir, "workers"))) == ["1"]


@pytest.mark.large
def test_two_workers_train_as_one(digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=8)
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    output_dir = str(tmp_path / "run")
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": REPOSITORY,
                   "TF_CPP_MIN_LOG_LEVEL": "3"}
    for name in distribute.JAX_VARIABLES + ("TF_CONFIG",):
        environment.pop(name, None)
    environments = [
        {**environment, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                 "task": {"type": "worker", "index": index}})}
        for index in range(2)
    ]
    outputs = run_together(environments, tiny_run(data_dir, output_dir, "multiworker", 4))
    # 2 replicas × 4 = a global batch of 8: 80 images make 10 steps; the rate scales with 8.
    for output in outputs:
        assert "2 replicas (--strategy multiworker), global batch 8 (4 per replica), 10 steps per epoch, " \
               "peak learning rate 0.000781" in output
    run_alone(environment, "all", tiny_run(data_dir, tmp_path / "one", "none", 8))
    run_alone(environment, "0/2", tiny_run(data_dir, tmp_path / "alone", "none", 8))
    assert_trained_as_one(output_dir, tmp_path / "one", tmp_path / "alone")
    assert os.path.exists(os.path.join(output_dir, "best.keras"))


@pytest.mark.large
def test_two_jax_processes_train_as_one(digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=8)
    # 20 validation images in global batches of 8: the last batch is cut in two halves of 2.
    validation = digits(tmp_path / "validation", per_class=2)
    output_dir = str(tmp_path / "run")
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPOSITORY,
                   "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    for name in distribute.JAX_VARIABLES + ("TF_CONFIG", "JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        environment.pop(name, None)  # gloo is the package's choice on CPUs
    (port,) = free_ports(1)
    environments = [
        {**environment, distribute.ADDRESSES: f"127.0.0.1:{port}", distribute.NUM_PROCESSES: "2",
         distribute.PROCESS_ID: str(index)}
        for index in range(2)
    ]
    extra = ("--val-data", validation)
    outputs = run_together(environments, tiny_run(data_dir, output_dir, "dataparallel", 4, *extra))
    for output in outputs:
        assert "2 replicas (--strategy dataparallel), global batch 8 (4 per replica), 10 steps per epoch, " \
               "peak learning rate 0.000781" in output
    run_alone(environment, "all", tiny_run(data_dir, tmp_path / "one", "none", 8, *extra))
    run_alone(environment, "0/2", tiny_run(data_dir, tmp_path / "alone", "none", 8, *extra))
    assert_trained_as_one(output_dir, tmp_path / "one", tmp_path / "alone")
    # Process 0 writes the run's files, process 1 only under workers/1.
    assert sorted(os.listdir(output_dir)) == ["best.json", "best.keras", "ema.keras", "final.keras", "logs",
                                              "recipe.json", "run.json", "workers"]
    # The validation accuracy counts the 20 images once each, the filling rows not at all.
    for folder in (output_dir, os.path.join(output_dir, "workers", "1")):
        with open(os.path.join(folder, "best.json")) as cluster, \
                open(os.path.join(tmp_path / "one", "best.json")) as one:
            cluster, one = json.load(cluster), json.load(one)
        assert cluster["monitor"] == "val_accuracy" and cluster["epoch"] == one["epoch"]
        assert cluster["value"] == pytest.approx(one["value"], abs=1e-6)


@pytest.mark.large
def test_jax_data_parallel_over_two_devices(digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=4)
    output_dir = tmp_path / "run"
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": REPOSITORY,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_cait.cli", "train",
         "--model", TINY_CAIT, "--data", data_dir, "--output-dir", str(output_dir),
         "--strategy", "dataparallel", "--image-size", "32", "--batch-size", "4",
         "--precision", "mixed_bfloat16", "--epochs", "1", "--warmup-epochs", "0",
         "--randaugment", "0", "--repeated-aug", "1", "--verbose", "2"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 replicas (--strategy dataparallel), global batch 8 (4 per replica), 5 steps per epoch" in done.stdout
    assert sorted(os.listdir(output_dir)) == ["best.json", "best.keras", "ema.keras", "final.keras", "logs",
                                              "recipe.json", "run.json"]


@pytest.mark.large
def test_half_set_keras_distribution_variables_end_the_command_in_one_line(digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=1)
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPOSITORY,
                   "TF_CPP_MIN_LOG_LEVEL": "3", distribute.NUM_PROCESSES: "2"}
    for name in (distribute.ADDRESSES, distribute.PROCESS_ID):
        environment.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "keras_cait.cli", "train", *tiny_run(data_dir, tmp_path / "run", "dataparallel", 4)],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("keras-cait")]
    assert lines == [
        "keras-cait train: --strategy dataparallel: KERAS_DISTRIBUTION_JOB_ADDRESSES, "
        "KERAS_DISTRIBUTION_PROCESS_ID not set while KERAS_DISTRIBUTION_NUM_PROCESSES is; set all "
        "three or none, e.g. KERAS_DISTRIBUTION_JOB_ADDRESSES=host1:12345,host2:12345 "
        "KERAS_DISTRIBUTION_NUM_PROCESSES=2 KERAS_DISTRIBUTION_PROCESS_ID=0 on host1 (and "
        "KERAS_DISTRIBUTION_PROCESS_ID=1 on host2)."
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "run")
