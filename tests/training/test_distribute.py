"""Distributed training: strategy choice, and two MultiWorkerMirroredStrategy workers on loopback."""

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_cait.training import distribute

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_CAIT = '{"embed_dim": 32, "depth": 1, "num_heads": 2, "init_values": 0.1, "patch_size": 8}'


def test_strategy_errors_name_the_backend_and_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="must be one of none, mirrored, multiworker, dataparallel"):
        distribute.distribution("horovod")
    with pytest.raises(ValueError, match="needs the jax backend .* --strategy mirrored"):
        distribute.distribution("dataparallel")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs the TF_CONFIG environment variable"):
        distribute.distribution("multiworker")


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


@pytest.mark.large
def test_two_workers_train_to_identical_weights(digits, tmp_path):
    data_dir = digits(tmp_path / "digits", per_class=8)
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    output_dir = str(tmp_path / "run")
    processes = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(config), "PYTHONPATH": REPOSITORY,
               "TF_CPP_MIN_LOG_LEVEL": "3"}
        command = [
            sys.executable, "-m", "keras_cait.cli", "train",
            "--model", TINY_CAIT, "--data", data_dir, "--output-dir", output_dir,
            "--strategy", "multiworker", "--image-size", "32", "--batch-size", "4",
            "--precision", "float32", "--epochs", "2", "--warmup-epochs", "1",
            "--randaugment", "0", "--repeated-aug", "1", "--verbose", "2",
        ]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=600)
        outputs.append(output)
        assert process.returncode == 0, output
    # 2 replicas × 4 = a global batch of 8: 80 images make 10 steps; the rate scales with 8.
    for output in outputs:
        assert "multiworker: 2 replica(s), global batch 8 (4 per replica), 10 steps per epoch, " \
               "peak learning rate 7.81e-06" in output

    chief = keras.models.load_model(os.path.join(output_dir, "final.keras"))
    other = keras.models.load_model(os.path.join(output_dir, "workers", "1", "final.keras"))
    assert len(chief.weights) == len(other.weights)
    for a, b in zip(chief.weights, other.weights):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert os.path.exists(os.path.join(output_dir, "best.keras"))


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
    assert "dataparallel: 2 replica(s), global batch 8 (4 per replica), 5 steps per epoch" in done.stdout
    assert sorted(os.listdir(output_dir)) == ["best.json", "best.keras", "ema.keras", "final.keras", "logs", "run.json"]
