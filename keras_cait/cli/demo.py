"""`keras-cait demo`: train, export, serve and look inside a CaiT, offline, in minutes.

The data are scikit-learn's bundled handwritten digits (1,797 real 8×8 scans,
no download), upsampled to RGB images. The demo

1. trains a CaiT on 1,297 of them with AdamW (Keras progress bars) and reports
   the accuracy on 200 validation digits;
2. exports it as a TensorFlow SavedModel;
3. reloads the SavedModel in a fresh Python process, which classifies the 300
   held-out digits the model never saw, and prints that accuracy;
4. writes the class-attention maps of held-out digits as PNGs.

Where it starts from (`--init`):
- "scratch": a small CaiT (4 self-attention + 2 class-attention blocks, width
  64) on 32×32 images, 4×4 patches, so the 8×8 patch grid is the digits' own
  pixel grid. 15 epochs at batch 32: 95.0% held-out accuracy with the demo's
  seed (95.0-96.7% over three seeds; the README's "Demo" section says why batch
  32 at 2e-3).
- "imagenet": CaiT-XXS24 with its ImageNet weights at 64×64 (position embedding
  resized to the 4×4 grid), backbone frozen, a new 10-way head trained on top.
  Fine-tuning all 26 blocks is too slow for two CPU cores; the frozen features
  already separate the digits well.
- "auto" (default): "imagenet" when those weights are cached or their host
  answers, else "scratch". Small mode always uses "scratch".

Small mode (`--small` or KERAS_CAIT_DEMO_SMALL=1, a quick check): a 2-block CaiT on
8×8 patches for a few epochs; well above chance, about a minute.

Everything goes to `--out` (default ./keras_cait_demo): `model.keras`,
`saved_model/1/` (a TF Serving version folder), `attention.png` (every head of both class-attention blocks on one
digit), `saliency.png` (first class-attention block, head-averaged, on eight
digits) and `summary.json` (accuracies, paths, wall time). Each file is written
to a temporary name first and renamed when complete.
"""

import argparse
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse

from keras_cait.io.atomic import written_atomically
from keras_cait.training.recipe import RECIPES, Recipe

SMALL_ENV = "KERAS_CAIT_DEMO_SMALL"
INIT_CHOICES = ("auto", "imagenet", "scratch")
HELD_OUT = 300
VALIDATION = 200
SEED = 0
IMAGENET_ARCH = "cait_xxs24_224"


@dataclasses.dataclass(frozen=True)
class Start:
    """What the demo trains from one starting point: image side, model and training recipe."""

    side: int
    model: dict  # build_cait arguments; empty for the ImageNet backbone
    recipe: Recipe

    @property
    def epochs(self):
        return self.recipe.epochs

    def with_epochs(self, epochs):
        """The same start for `epochs` epochs, a tenth of them warmup, as the recipe has it."""
        return dataclasses.replace(self, recipe=self.recipe.replace(epochs=epochs, warmup_epochs=epochs / 10))


_QUICK = RECIPES["scratch"].replace(batch_size=64, lr=1e-3, lr_batch=64)
STARTS = {
    # RECIPES["scratch"], the recipe of a CaiT from random weights on a small folder: batch 32 at
    # 2e-3, 15 epochs (recipe.py says why).
    "scratch": Start(side=32, model=dict(embed_dim=64, depth=4, num_heads=4, init_values=0.1, patch_size=4),
                     recipe=RECIPES["scratch"]),
    "small": Start(side=32, model=dict(embed_dim=64, depth=2, num_heads=4, init_values=0.1, patch_size=8),
                   recipe=_QUICK).with_epochs(6),
    "imagenet": Start(side=64, model={}, recipe=_QUICK).with_epochs(4),
}


def require_extras():
    """Fails before training, not after, when the demo's optional packages are missing."""
    import importlib.util

    missing = [name for name in ("sklearn", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"keras-cait demo needs {' and '.join(missing)}; install the demo extra: "
            'pip install "keras-cait[demo]"'
        )


def load_digits_images(side):
    """scikit-learn's 1,797 digits as `(images (N, side, side, 3) float32 0..255, labels (N,))`."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(
            "The demo's data are scikit-learn's bundled digits; install it with "
            'pip install "keras-cait[demo]"'
        ) from error
    import numpy as np
    from keras import ops

    digits = load_digits()
    grey = digits.images.astype("float32")[..., None] * (255.0 / 16.0)  # scans are 0..16
    images = ops.convert_to_numpy(ops.image.resize(grey, (side, side), interpolation="bilinear"))
    return np.repeat(np.clip(images, 0, 255), 3, axis=-1), digits.target.astype("int32")


def split(images, labels):
    """Stratified train / validation / held-out split, the same on every run."""
    from sklearn.model_selection import train_test_split

    rest_x, held_x, rest_y, held_y = train_test_split(
        images, labels, test_size=HELD_OUT, stratify=labels, random_state=SEED
    )
    train_x, val_x, train_y, val_y = train_test_split(
        rest_x, rest_y, test_size=VALIDATION, stratify=rest_y, random_state=SEED
    )
    return (train_x, train_y), (val_x, val_y), (held_x, held_y)


def imagenet_weights_available():
    """(available, why): the ImageNet weights are cached, or their host answers within 3 s."""
    from keras_cait.weights import cached_checkpoint, registry

    cached = cached_checkpoint(IMAGENET_ARCH)
    if cached:
        return True, f"ImageNet weights cached at {cached}"
    url = urllib.parse.urlparse(registry.checkpoint_url(IMAGENET_ARCH))
    host = url.hostname
    try:
        socket.create_connection((host, url.port or (443 if url.scheme == "https" else 80)), timeout=3).close()
    except OSError:
        return False, f"no cached ImageNet weights and {host} is unreachable"
    return True, f"ImageNet weights downloadable from {host}"


def build_model(init, start, classes=10):
    """The demo's CaiT: a small one from scratch, or CaiT-XXS24 (ImageNet, frozen) + a new head."""
    from keras_cait.models.architecture import build_cait
    from keras_cait.training import set_backbone_trainable, with_new_head
    from keras_cait.models.variants import CaiT_XXS24

    input_shape = (start.side, start.side, 3)
    if init == "scratch":
        return build_cait(**start.model, input_shape=input_shape, classes=classes, name="cait_digits")
    backbone = CaiT_XXS24(weights="imagenet", include_top=False, pooling="token", input_shape=input_shape)
    model = with_new_head(backbone, classes, name="cait_xxs24_digits")
    set_backbone_trainable(model, False)
    return model


def _write_text(path, text):
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)


def export_saved_model(model, base_path):
    """Writes `model` for TF Serving as version 1 under `base_path`, with the digit names."""
    from keras_cait.export import export_saved_model as export

    classes = model.output_shape[-1]
    return export(
        model, os.path.join(base_path, "1"), class_names=[str(i) for i in range(classes)],
        top_k=3, overwrite=True,
    )


def classify_in_fresh_process(saved_model, images, labels, workdir):
    """Classifies `images` in a new Python process that knows nothing of the model in this one.

    The child reads the SavedModel with TensorFlow's own loader (`tf.saved_model.load`,
    not Keras), as a serving system would, and prints its predictions as JSON.
    """
    import numpy as np

    batch = os.path.join(workdir, "held_out.npz")
    np.savez(batch, images=images, labels=labels)
    child = subprocess.run(
        [sys.executable, "-m", "keras_cait.cli.demo", "--classify", saved_model, batch],
        capture_output=True, text=True,
    )
    os.remove(batch)
    if child.returncode:
        raise RuntimeError(f"The fresh process could not classify with {saved_model}:\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _classify(saved_model, batch):
    """The fresh process: the SavedModel's serving signature through TensorFlow's loader."""
    import numpy as np
    import tensorflow as tf

    data = np.load(batch)
    serve = tf.saved_model.load(saved_model).signatures["serving_default"]
    probabilities = np.concatenate([
        serve(images=tf.constant(data["images"][i : i + 100], tf.float32))["probabilities"].numpy()
        for i in range(0, len(data["images"]), 100)
    ])
    predictions = probabilities.argmax(-1)
    print(json.dumps({
        "accuracy": float((predictions == data["labels"]).mean()),
        "predictions": predictions.tolist(),
    }))


def write_attention_figures(model, images, labels, predictions, out):
    """attention.png (all heads, first digit) and saliency.png (eight digits) in `out`."""
    from keras_cait.inspection.attention import attention_maps
    from keras_cait.inspection.visualize import class_attention_figure, saliency_figure, save_figure

    images = images[:8]
    maps = attention_maps(model, images)
    heads = save_figure(class_attention_figure(images, maps), os.path.join(out, "attention.png"))
    titles = [f"{p} (true {t})" for p, t in zip(predictions[:8], labels[:8])]
    saliency = save_figure(
        saliency_figure(images, maps, labels=titles), os.path.join(out, "saliency.png")
    )
    return heads, saliency


def run(out="keras_cait_demo", init="auto", small=False, epochs=None):
    """Runs the whole demo; returns the summary it also writes to `out/summary.json`."""
    if init not in INIT_CHOICES:
        raise ValueError(f"init={init!r}: must be one of {INIT_CHOICES}.")
    require_extras()
    started = time.perf_counter()
    if small:
        init, why = "scratch", "small mode"
    elif init == "auto":
        available, why = imagenet_weights_available()
        init = "imagenet" if available else "scratch"
    else:
        why = "asked for"
    start = STARTS["small" if small else init]
    if epochs is not None:
        start = start.with_epochs(int(epochs))
    recipe = start.recipe
    print(f"keras-cait demo: starting from {init} ({why}); {recipe.epochs} epochs at "
          f"{start.side}x{start.side}.", flush=True)

    import keras

    from keras_cait.cli.runs import progress_verbose
    from keras_cait.training import run

    keras.utils.set_random_seed(SEED)
    (train_x, train_y), (val_x, val_y), (held_x, held_y) = split(*load_digits_images(start.side))
    print(f"digits: {len(train_x)} to train on, {len(val_x)} to validate, {len(held_x)} held out.")
    model = build_model(init, start)
    # Compiled as keras_cait.training.run compiles a run: the recipe's AdamW and schedule.
    run.compile_for(model, recipe, recipe.batch_size, steps_per_epoch=-(-len(train_x) // recipe.batch_size))
    history = model.fit(
        train_x, keras.utils.to_categorical(train_y, 10),
        validation_data=(val_x, keras.utils.to_categorical(val_y, 10)),
        epochs=recipe.epochs, batch_size=recipe.batch_size, verbose=progress_verbose("train"),
    )
    val_accuracy = float(history.history["val_accuracy"][-1])
    print(f"validation accuracy: {val_accuracy:.1%}", flush=True)

    os.makedirs(out, exist_ok=True)
    keras_file = os.path.join(out, "model.keras")
    with written_atomically(keras_file) as partial:
        model.save(partial)
    saved_model = export_saved_model(model, os.path.join(out, "saved_model"))
    print(f"exported the SavedModel to {saved_model}; reloading it in a fresh process ...", flush=True)
    served = classify_in_fresh_process(saved_model, held_x, held_y, out)
    print(f"held-out accuracy of the reloaded SavedModel: {served['accuracy']:.1%} "
          f"({len(held_x)} digits never seen in training)")

    heads, saliency = write_attention_figures(model, held_x, held_y, served["predictions"], out)
    print(f"attention maps: {heads}, {saliency}")

    summary = dict(
        init=init, epochs=recipe.epochs, image_side=start.side, small=small,
        train_images=len(train_x), validation_accuracy=val_accuracy,
        held_out_images=len(held_x), held_out_accuracy=served["accuracy"],
        keras_model=keras_file, saved_model=saved_model, attention_png=heads, saliency_png=saliency,
        wall_seconds=round(time.perf_counter() - started, 1),
    )
    summary_path = os.path.join(out, "summary.json")
    with written_atomically(summary_path) as partial:
        _write_text(partial, json.dumps(summary, indent=2) + "\n")
    print(f"done in {summary['wall_seconds']:.0f} s; summary in {summary_path}")
    return summary


def small_from_environment():
    return os.environ.get(SMALL_ENV, "").strip().lower() in ("1", "true", "yes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The demo's fresh serving process.")
    parser.add_argument("--classify", nargs=2, metavar=("SAVED_MODEL", "BATCH_NPZ"), required=True)
    _classify(*parser.parse_args().classify)
