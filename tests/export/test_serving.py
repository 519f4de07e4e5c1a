"""The SavedModel as TF Serving sees it: saved_model_cli, the REST JSON format, a real model server."""

import base64
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2

import keras_cait
from keras_cait.cli import main as cli_main
from keras_cait.images.evaluation_transform import IMAGE_FORMATS
from tests.export import tf_serving_rest
from tests.export.helpers import (
    SIDE,
    encode,
    photo,
    randomize_deep,
    saved_model_cli_run_in_fresh_process,
    serving_contract,
)

SAVED_MODEL_CLI = str(Path(sys.executable).with_name("saved_model_cli"))


def saved_model_cli(*args):
    process = subprocess.run([SAVED_MODEL_CLI, *args], capture_output=True, text=True)
    assert process.returncode == 0, process.stderr[-3000:]
    return process.stdout


def parse_show_all(text):
    """`saved_model_cli show --all` -> {signature: (inputs, outputs)} like `serving_contract`."""
    signatures, tensors = {}, None
    for line in text.splitlines():
        if match := re.match(r"signature_def\['(\w+)'\]:", line):
            signatures[match[1]] = ({}, {})
        elif match := re.match(r"\s+(inputs|outputs)\['(\w+)'\] tensor_info:", line):
            tensors = signatures[list(signatures)[-1]][match[1] == "outputs"]
            name = match[2]
        elif match := re.match(r"\s+dtype: (DT_\w+)", line):
            tensors[name] = [match[1], None]
        elif match := re.match(r"\s+shape: \(([-\d, ]*)\)", line):
            tensors[name][1] = [int(size) for size in match[1].split(",") if size.strip()]

    def dtype(name):
        return tf.dtypes.as_dtype(types_pb2.DataType.Value(name)).name

    return {
        signature: tuple({name: (dtype(kind), shape) for name, (kind, shape) in group.items()} for group in groups)
        for signature, groups in signatures.items()
        if signature.startswith("serving")
    }


# === saved_model_cli ===


@pytest.mark.large
def test_saved_model_cli_show_lists_the_documented_signatures(saved_model_dir):
    shown = parse_show_all(saved_model_cli("show", "--all", "--dir", str(saved_model_dir)))
    assert shown == serving_contract(SIDE, SIDE, classes=1000, top_k=5)


@pytest.mark.large
def test_saved_model_cli_run_gives_model_predict(saved_model_dir, model, images, tmp_path):
    np.save(tmp_path / "images.npy", images)
    saved_model_cli(
        "run", "--dir", str(saved_model_dir), "--tag_set", "serve", "--signature_def", "serving_default",
        "--inputs", f"images={tmp_path / 'images.npy'}", "--outdir", str(tmp_path / "out"),
    )
    expected = model.predict(images, verbose=0)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "probabilities.npy"), expected, rtol=1e-5, atol=0)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "top_k_indices.npy"), np.argsort(-expected, 1)[:, :5])


# === TF Serving's REST predict format ===


def rest(loaded, request):
    status, body = tf_serving_rest.predict(loaded.signatures, json.dumps(request))
    return status, json.loads(body)


def test_rest_row_format(loaded, model, images):
    status, response = rest(loaded, {"instances": images.astype(int).tolist()})
    assert status == 200 and len(response["predictions"]) == len(images)
    expected = model.predict(images, verbose=0)
    for prediction, probabilities in zip(response["predictions"], expected):
        assert set(prediction) == {"probabilities", "top_k_indices", "top_k_probabilities", "top_k_classes"}
        np.testing.assert_allclose(prediction["probabilities"], probabilities, rtol=1e-5, atol=0)
        best = np.argsort(-probabilities)[:5]
        assert prediction["top_k_indices"] == best.tolist()
        assert prediction["top_k_classes"] == [keras_cait.preprocessing.imagenet_classes()[i][1] for i in best]


def test_rest_columnar_format_and_the_uint8_signature(loaded, images):
    _, rows = rest(loaded, {"instances": images.astype(int).tolist()})
    for request in (
        {"inputs": images.astype(int).tolist()},
        {"inputs": {"images": images.astype(int).tolist()}},
        {"signature_name": "serving_uint8", "inputs": images.astype(int).tolist()},
    ):
        status, response = rest(loaded, request)
        assert status == 200 and set(response["outputs"]) == set(rows["predictions"][0])
        for key, column in response["outputs"].items():
            assert column == [row[key] for row in rows["predictions"]], key


def test_rest_base64_jpeg_and_png_to_the_bytes_signature(loaded):
    files = [encode(photo(90, 120, seed=1), "JPEG"), encode(photo(50, 40, seed=2), "PNG")]
    direct = loaded.signatures["serving_bytes"](image_bytes=tf.constant(files))
    b64 = [{"b64": base64.b64encode(file).decode()} for file in files]
    _, rows = rest(loaded, {"signature_name": "serving_bytes", "instances": b64})
    _, columns = rest(loaded, {"signature_name": "serving_bytes", "inputs": {"image_bytes": b64}})
    np.testing.assert_allclose([row["probabilities"] for row in rows["predictions"]], direct["probabilities"], rtol=1e-6)
    np.testing.assert_allclose(columns["outputs"]["probabilities"], direct["probabilities"], rtol=1e-6)
    assert columns["outputs"]["top_k_classes"] == direct["top_k_classes"].numpy().astype(str).tolist()


def test_rest_errors_say_what_was_expected(loaded):
    status, response = rest(loaded, {"instances": np.zeros((1, 48, 48, 3)).tolist()})
    assert status == 400 and "[batch, 32, 32, 3]" in response["error"] and "got [1, 48, 48, 3]" in response["error"]
    status, response = rest(loaded, {"signature_name": "serving_bytes", "instances": [{"b64": "aGVsbG8="}]})
    assert status == 400 and f"must be {IMAGE_FORMATS} files" in response["error"]
    status, response = rest(loaded, {"signature_name": "serving_jpeg", "instances": []})
    assert status == 400 and "serving_jpeg" in response["error"]


# === A real tensorflow_model_server ===

MODEL_SERVER = shutil.which("tensorflow_model_server")
needs_model_server = pytest.mark.skipif(
    MODEL_SERVER is None,
    reason="tensorflow_model_server is not on PATH; TF Serving has no pip package (install "
    "tensorflow-model-server from its apt repository, or use the tensorflow/serving image)",
)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def model_server(saved_model_dir):
    rest_port, grpc_port = _free_port(), _free_port()
    server = subprocess.Popen(
        [MODEL_SERVER, f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--rest_api_timeout_in_ms=60000",
         "--model_name=cait", f"--model_base_path={saved_model_dir.parent}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{rest_port}/v1/models/cait"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url) as response:
                    if json.load(response)["model_version_status"][0]["state"] == "AVAILABLE":
                        break
            except (urllib.error.URLError, ConnectionError, KeyError):
                pass
            assert server.poll() is None and time.monotonic() < deadline, "tensorflow_model_server did not start"
            time.sleep(1)
        yield url, f"127.0.0.1:{grpc_port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _post(url, request):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, json.dumps(request).encode(), method="POST")) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@needs_model_server
def test_model_server_rest(model_server, loaded, images):
    url, _ = model_server
    photo_b64 = {"b64": base64.b64encode(encode(photo(90, 120), "JPEG")).decode()}
    for request in (
        {"instances": images.astype(int).tolist()},
        {"signature_name": "serving_uint8", "inputs": {"images": images.astype(int).tolist()}},
        {"signature_name": "serving_bytes", "instances": [photo_b64]},
        {"instances": np.zeros((1, 48, 48, 3)).tolist()},
    ):
        assert _post(f"{url}:predict", request) == rest(loaded, request)


@needs_model_server
def test_model_server_grpc(model_server, model, images):
    import grpc  # grpcio comes with TensorFlow
    predict_pb2 = pytest.importorskip(
        "tensorflow_serving.apis.predict_pb2", reason="the gRPC API needs pip install tensorflow-serving-api"
    )
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    _, address = model_server
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(address))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "cait"
    request.model_spec.signature_name = "serving_uint8"
    request.inputs["images"].CopyFrom(tf.make_tensor_proto(images.astype("uint8")))
    response = stub.Predict(request, timeout=60)
    probabilities = tf.make_ndarray(response.outputs["probabilities"])
    np.testing.assert_allclose(probabilities, model.predict(images, verbose=0), rtol=1e-5, atol=0)

    request.inputs["images"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 48, 48, 3), "uint8")))
    with pytest.raises(grpc.RpcError) as error:
        stub.Predict(request, timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "[batch, 32, 32, 3]" in error.value.details()


# === CaiT-XXS24 at 224 through the whole path ===


@pytest.mark.large
def test_full_size_cait_xxs24_through_keras_cait_export(tmp_path):
    model = keras_cait.CaiT_XXS24(weights=None)
    randomize_deep(model)
    model.save_weights(tmp_path / "xxs24.weights.h5")
    version = tmp_path / "serving" / "cait_xxs24" / "1"
    cli_main(["export", str(version), "--model", "cait_xxs24_224", "--weights", str(tmp_path / "xxs24.weights.h5")])

    images = np.random.RandomState(0).randint(0, 256, (2, 224, 224, 3)).astype("float32")
    expected = model.predict(images, verbose=0)
    assert np.abs(expected[0] - expected[1]).max() > 100 * 1e-5 * expected.max()  # the images matter
    served = saved_model_cli_run_in_fresh_process(version, images, tmp_path)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=0)
