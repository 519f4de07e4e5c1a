"""Helpers of the export tests: the small model, photo-like test images, the serving contract."""

import io
import struct
import subprocess
import sys
import zlib

import numpy as np
import tensorflow as tf
from PIL import Image
from tensorflow.core.protobuf import saved_model_pb2

from keras_cait.models.architecture import build_cait
from tests.conftest import TINY_CAIT, TINY_SIZE
from tests.layers.reference import randomize

SIDE = TINY_SIZE
SIGNATURE_OUTPUTS = ("probabilities", "top_k_classes", "top_k_indices", "top_k_probabilities")


def serving_contract(height, width, classes, top_k):
    """{signature: (inputs, outputs)}, each {name: (dtype, shape)}, -1 for the batch: the documented contract."""
    outputs = {
        "probabilities": ("float32", [-1, classes]),
        "top_k_classes": ("string", [-1, top_k]),
        "top_k_indices": ("int32", [-1, top_k]),
        "top_k_probabilities": ("float32", [-1, top_k]),
    }
    return {
        "serving_default": ({"images": ("float32", [-1, height, width, 3])}, outputs),
        "serving_uint8": ({"images": ("uint8", [-1, height, width, 3])}, outputs),
        "serving_bytes": ({"image_bytes": ("string", [-1])}, outputs),
    }


def small_model(seed=0, **kwargs):
    """conftest's small CaiT (`TINY_CAIT` at `TINY_SIZE`) with every weight random (biases and
    norms too, so nothing is trivial); keyword arguments override, as for `tiny_cait`."""
    model = build_cait(**{**TINY_CAIT, "input_shape": (SIDE, SIDE, 3), **kwargs})
    randomize(model, seed=seed, scale=0.2)
    return model


def photo(height, width, seed=0):
    """A deterministic photo-like RGB image: smooth colour waves, a hard-edged patch, sensor noise."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    image = np.stack(
        [128 + 100 * np.sin(2 * np.pi * (3 * x + y)), 128 + 100 * np.cos(2 * np.pi * (2 * y - x)), 255 * x * y],
        axis=-1,
    )
    image[height // 3 : height // 2, width // 4 : width // 2] = (250, 20, 30)
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype("uint8")


def encode(image, image_format):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=image_format, quality=90)
    return buffer.getvalue()


class TFServingSession:
    """Runs signatures the way TF Serving's Predict does: `Session::Run` on the MetaGraph.

    TF Serving feeds the request tensors to the signature's placeholders without
    comparing them to the signature's shapes; Python's `Session.run` would refuse
    a mismatching feed before the graph runs, so the C API call is used directly.
    """

    def __init__(self, path):
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            meta_graph = tf.compat.v1.saved_model.load(self.session, ["serve"], str(path))
        self.signatures = meta_graph.signature_def

    def run(self, signature, **inputs):
        definition = self.signatures[signature]
        feeds = {
            self.graph.get_tensor_by_name(definition.inputs[name].name)._as_tf_output(): value
            for name, value in inputs.items()
        }
        names = sorted(definition.outputs)
        fetches = [self.graph.get_tensor_by_name(definition.outputs[name].name)._as_tf_output() for name in names]
        values = self.session._call_tf_sessionrun(None, feeds, fetches, [], None)
        return dict(zip(names, values))


def signature_types(path):
    """The serving signatures of the SavedModel at `path`, as `serving_contract` states them.

    Read from saved_model.pb, the file TF Serving reads, without loading the model.
    """
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    (meta_graph,) = proto.meta_graphs
    assert list(meta_graph.meta_info_def.tags) == ["serve"]

    def describe(tensors):
        return {
            name: (tf.dtypes.as_dtype(info.dtype).name, [dim.size for dim in info.tensor_shape.dim])
            for name, info in tensors.items()
        }

    return {
        name: (describe(signature.inputs), describe(signature.outputs))
        for name, signature in meta_graph.signature_def.items()
        if signature.method_name == "tensorflow/serving/predict"
    }


def randomize_deep(model, seed=0, scale=0.05):
    """Every weight random, the LayerNorms near the identity.

    `randomize` also scales the LayerNorms down, which is fine for two blocks, but
    through 26 the class token then no longer depends on the image.
    """
    rng = np.random.RandomState(seed)
    for weight in model.weights:
        if "norm/" in weight.path:
            weight.assign(np.asarray(weight) + rng.normal(0, 0.1, weight.shape))
        else:
            weight.assign(rng.normal(0, scale, weight.shape))


WITHOUT_KERAS_CAIT = """
import importlib.abc, sys

class RefuseKerasCait(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "keras_cait":
            raise ImportError("an exported model must run without keras_cait")

sys.meta_path.insert(0, RefuseKerasCait())
"""

SERVE_WITH_TF2_LOADER = """
import numpy as np
import tensorflow as tf

folder, inputs_file, outputs_file = sys.argv[1:]
inputs = np.load(inputs_file)
signatures = tf.saved_model.load(folder).signatures
default = signatures["serving_default"](images=tf.constant(inputs["images"]))
encoded = signatures["serving_bytes"](image_bytes=tf.constant([inputs["png"].tobytes()]))
assert "keras_cait" not in sys.modules
outputs = {name: value.numpy() for name, value in default.items()}
outputs["top_k_classes"] = outputs["top_k_classes"].astype(str)
np.savez(outputs_file, bytes_probabilities=encoded["probabilities"].numpy(), **outputs)
"""

SAVED_MODEL_CLI = """
from tensorflow.python.tools import saved_model_cli

sys.argv = ["saved_model_cli", *sys.argv[1:]]
try:
    saved_model_cli.main()
except SystemExit as exit:
    assert not exit.code, exit.code
assert "keras_cait" not in sys.modules
"""


def _python(script, *args, cwd):
    process = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert process.returncode == 0, process.stderr[-3000:]


def run_in_fresh_process(folder, images, png, tmp_path):
    """Serves `images` and one PNG file in a new Python that cannot import keras_cait."""
    inputs, outputs = tmp_path / "inputs.npz", tmp_path / "outputs.npz"
    np.savez(inputs, images=images, png=np.frombuffer(png, dtype="uint8"))
    _python(WITHOUT_KERAS_CAIT + SERVE_WITH_TF2_LOADER, folder, inputs, outputs, cwd=tmp_path)
    with np.load(outputs) as result:
        return {name: result[name] for name in result.files}


def saved_model_cli_run_in_fresh_process(folder, images, tmp_path):
    """`saved_model_cli run` on serving_default, in a new Python that cannot import keras_cait.

    Returns its probabilities.npy: saved_model_cli loads the model into a TF1
    session and calls Session.run, as TF Serving does.
    """
    np.save(tmp_path / "images.npy", images)
    _python(
        WITHOUT_KERAS_CAIT + SAVED_MODEL_CLI,
        "run", "--dir", folder, "--tag_set", "serve", "--signature_def", "serving_default",
        "--inputs", f"images={tmp_path / 'images.npy'}", "--outdir", tmp_path / "out",
        cwd=tmp_path,
    )
    return np.load(tmp_path / "out" / "probabilities.npy")


def png_header(width, height):
    """A PNG signature and IHDR chunk (no pixel data) claiming `width` × `height` RGB pixels."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))


def gif_of_frames(frames, sides=(64, 64)):
    """A GIF with a 64×64 screen and `frames` frames; `sides` (height, width) of the last one,
    as its image descriptor declares (its pixel data stays 64×64's: it is never decoded)."""
    encoded = io.BytesIO()
    Image.new("P", (64, 64), 1).save(encoded, "GIF")
    data = encoded.getvalue()
    start = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)  # after the colour table
    assert data[start] == 0x2C, "PIL wrote something before the image descriptor"
    frame = data[start:-1]
    last = frame[:5] + struct.pack("<HH", sides[1], sides[0]) + frame[9:]
    return data[:start] + frame * (frames - 1) + last + b";"
