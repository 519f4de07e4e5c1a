"""Measures what each export of CaiT-XXS24 gives against Keras and writes the table into docs/export.md.

    python scripts/export_report.py --weights imagenet    # the released checkpoint
    python scripts/export_report.py --weights random      # no download: random weights

For each target (SavedModel, ONNX, LiteRT float32, LiteRT dynamic-range int8) it
runs 64 fixed random 224×224 images through the exported file with the runtime
that serves it and reports the largest probability difference to
`model.predict`, the top-1 agreement and the file size. It also measures how
far the SavedModel's serving_bytes signature (decode, resize, crop in the graph)
is from `keras-cait predict`'s PIL loader on a few photo-like JPEG and PNG files.

"random" draws every kernel, bias and embedding from N(0, 0.05) and keeps the
LayerNorms at their initial identity: at the constructors' own initialisation
(LayerScale 1e-5) every block is nearly the identity and all images get the
same class, which would make any agreement figure meaningless.
"""

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

import keras_cait
from keras_cait import export

DOC = Path(__file__).resolve().parent.parent / "docs" / "export.md"
START, END = "<!-- export_report:start -->", "<!-- export_report:end -->"
SIDE = 224


def pil_reference(path, side):
    """timm's evaluation transform for CaiT (crop_pct 1.0) with PIL, as torchvision applies it."""
    image = Image.open(path).convert("RGB")
    width, height = image.size
    long = side * max(width, height) // min(width, height)
    size = (side, long) if width <= height else (long, side)
    image = image.resize(size, Image.BICUBIC)
    left, top = round((size[0] - side) / 2), round((size[1] - side) / 2)
    return np.asarray(image.crop((left, top, left + side, top + side)), "float32")


def build(weights):
    if weights != "random":
        return keras_cait.CaiT_XXS24(weights=None if weights == "none" else weights)
    model = keras_cait.CaiT_XXS24(weights=None)
    rng = np.random.RandomState(0)
    for weight in model.weights:
        if "norm/" not in weight.path:
            weight.assign(rng.normal(0, 0.05, weight.shape))
    return model


def photo_files(folder):
    """Photo-like test files: colour waves, a hard-edged patch, noise; JPEG and PNG, several sizes."""
    paths = []
    for seed, (height, width, image_format) in enumerate(
        [(375, 500, "JPEG"), (500, 333, "JPEG"), (480, 640, "PNG"), (160, 200, "PNG")]
    ):
        rng = np.random.RandomState(seed)
        y, x = np.mgrid[0:height, 0:width] / max(height, width)
        waves = [128 + 100 * np.sin(6 * np.pi * x), 128 + 100 * np.cos(4 * np.pi * y), 255 * x * y]
        image = np.stack(waves, axis=-1)
        image[height // 3 : height // 2, width // 4 : width // 2] = (250, 20, 30)
        image = np.clip(image + rng.normal(0, 8, image.shape), 0, 255).astype("uint8")
        path = folder / f"{seed}.{image_format.lower()}"
        Image.fromarray(image).save(path, format=image_format, quality=90)
        paths.append(path)
    return paths


def compare(name, probabilities, expected, path):
    """A table row: largest probability difference, top-1 agreement, size on disk."""
    path = Path(path)
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    size = sum(f.stat().st_size for f in files) / 2**20
    agreeing = int((probabilities.argmax(1) == expected.argmax(1)).sum())
    difference = np.abs(probabilities - expected).max()
    return f"| {name} | {difference:.1e} | {agreeing}/{len(expected)} | {size:.1f} MiB |"


def softmax(logits):
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="imagenet", help="imagenet, random, none, or a checkpoint path")
    parser.add_argument("--images", type=int, default=64)
    args = parser.parse_args()

    model = build(args.weights)
    logits_model = keras_cait.CaiT_XXS24(weights=None, classifier_activation=None)
    logits_model.set_weights(model.get_weights())
    images = np.random.RandomState(0).uniform(0, 255, (args.images, SIDE, SIDE, 3)).astype("float32")
    expected = model.predict(images, batch_size=16, verbose=0)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        saved_model = export.export_saved_model(model, folder / "serving" / "1")
        signatures = tf.saved_model.load(str(saved_model)).signatures
        served = np.concatenate([
            signatures["serving_default"](images=tf.constant(batch))["probabilities"].numpy()
            for batch in np.split(images, len(images) // 16)
        ])
        rows.append(compare("SavedModel (TF Serving), serving_default", served, expected, saved_model))

        import onnxruntime

        export.export_onnx(logits_model, folder / "cait.onnx")
        session = onnxruntime.InferenceSession(str(folder / "cait.onnx"), providers=["CPUExecutionProvider"])
        rows.append(compare("ONNX (onnxruntime)", softmax(session.run(None, {"images": images})[0]), expected,
                            folder / "cait.onnx"))

        from ai_edge_litert.interpreter import Interpreter

        for quantization in (None, "dynamic_int8"):
            path = folder / f"cait_{quantization or 'float32'}.tflite"
            export.export_litert(logits_model, path, quantization=quantization)
            runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
            logits = np.concatenate([next(iter(runner(images=image[None]).values())) for image in images])
            name = f"LiteRT (ai-edge-litert), {quantization or 'float32'}"
            rows.append(compare(name, softmax(logits), expected, path))

        files = photo_files(folder)
        in_graph = export._decode_and_crop(tf.constant([p.read_bytes() for p in files]), SIDE, SIDE).numpy()
        with_pil = np.stack([pil_reference(p, SIDE) for p in files])
        pixels = np.abs(in_graph - with_pil)
        from_bytes = signatures["serving_bytes"](image_bytes=tf.constant([p.read_bytes() for p in files]))
        from_pil = model.predict(with_pil, verbose=0)
        relative = np.abs(from_bytes["probabilities"].numpy() - from_pil).max() / from_pil.max()

    table = "\n".join([
        f"Measured by `python scripts/export_report.py --weights {args.weights}` on CaiT-XXS24 at {SIDE}×{SIDE}, "
        f"{args.images} fixed random images (uniform noise, seed 0); differences are of the probabilities "
        f"against `model.predict` (whose top-1 probability has median {np.median(expected.max(1)):.2g} on "
        "these images), agreement is of the top-1 class.",
        "",
        "| target (runtime) | max abs difference | top-1 agreement | size |",
        "|---|---|---|---|",
        *rows,
        "",
        f"serving_bytes (keras_cait's evaluation transform) against timm's PIL transform on {len(files)} photo-like JPEG/PNG files: "
        f"pixels differ by {pixels.mean():.2f} levels on average (99th percentile "
        f"{np.percentile(pixels, 99):.0f}, max {pixels.max():.0f}); probabilities by at most {relative:.1e} "
        "of the largest one.",
    ])
    text = DOC.read_text()
    text = re.sub(f"{START}.*{END}", lambda _: f"{START}\n{table}\n{END}", text, flags=re.S)
    DOC.write_text(text)
    print(table)


if __name__ == "__main__":
    main()
