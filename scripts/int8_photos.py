"""What Keras int8, int4 and float8 (`model.quantize(mode)`) and the bfloat16 SavedModel cost against
float32 on real photos.

    python scripts/int8_photos.py --output int8_photos.json [--modes int8 int4 float8 bfloat16] [--variants XXS24 S24]

The two photos scikit-learn ships (`load_sample_images`: china.jpg, flower.jpg,
640×427) go through the reference evaluation crop to 224×224 and into CaiT_XXS24 and
CaiT_S24 in float32 and in each mode; the size is of the model's `.weights.h5` file.
No pretrained weights can be downloaded here, so
the weights are random, in two ways that bracket a trained model:

    init     the constructors' own initialisation: LayerScale 1e-5, so every block is
             nearly the identity and int8's rounding barely propagates (the logits
             hardly differ between images or classes either);
    random   every weight N(0, 0.05), LayerNorm scales 1 + N(0, 0.05): LayerScale 0.05
             and random attention make the 24 blocks chaotic, so that any rounding
             grows through the depth.

Keras' float8 is its float8 training mode: kernels and inputs are rounded to
float8 (e4m3) with scales in each call, the kernels themselves stay float32.
bfloat16 is what `export_saved_model(..., compute_dtype="bfloat16")` computes (its
inference graph, called here for the logits); its size is of its weights.

Random-weight logits are not ImageNet predictions; top-1/top-5 agreement on two
images is an illustration only.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

VARIANTS = ("XXS24", "S24")


def photos():
    """The two sample photos, cropped as the reference evaluation does, 0..255 float32."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    from keras_cait.images.evaluation_transform import evaluation_transform

    return np.stack([evaluation_transform(tf.constant(image), 224).numpy() for image in load_sample_images().images])


def randomised(model, seed=0):
    import numpy as np

    rng = np.random.RandomState(seed)
    for weight in model.weights:
        value = rng.normal(0.0, 0.05, weight.shape)
        weight.assign(value + 1.0 if weight.path.endswith("/gamma") else value)
    return model


def weights_size(model):
    """Bytes of `model`'s .weights.h5 file."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.weights.h5")
        model.save_weights(path)
        return os.path.getsize(path)


def compare(variant, weights, images, mode):
    import keras
    import numpy as np

    from keras_cait.models.variants import cait

    model = cait(variant, weights=None, classifier_activation=None)
    if weights == "random":
        model = randomised(model)
    full = model.predict(images, verbose=0)
    if mode == "bfloat16":
        from keras_cait.export.inference_graph import InferenceGraph

        graph = InferenceGraph(model, compute_dtype="bfloat16")
        changed = graph(images).numpy()
        changed_bytes = sum(variable.numpy().nbytes for variable in graph.variables)
    else:
        quantized = keras.Model.from_config(model.get_config())
        quantized.set_weights(model.get_weights())
        quantized.quantize(mode, filters=lambda layer: isinstance(layer, keras.layers.Dense))
        changed, changed_bytes = quantized.predict(images, verbose=0), weights_size(quantized)
    top5 = [len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) / 5 for a, b in zip(full, changed)]
    return dict(
        variant=variant,
        weights=weights,
        mode=mode,
        relative_logit_change=float(np.linalg.norm(changed - full) / np.linalg.norm(full)),
        max_logit_change=float(np.abs(changed - full).max()),
        max_logit_change_over_range=float(np.abs(changed - full).max() / np.ptp(full)),
        top1_agreement=float((full.argmax(-1) == changed.argmax(-1)).mean()),
        top5_overlap=float(np.mean(top5)),
        images=len(images),
        float32_bytes=weights_size(model),
        quantized_bytes=changed_bytes,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True)
    parser.add_argument("--modes", nargs="+", default=["int8", "int4", "float8", "bfloat16"],
                        choices=["int8", "int4", "float8", "bfloat16"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()
    images = photos()
    print("| model | weights | mode | ‖q − f32‖ / ‖f32‖ (logits) | largest logit change | max change / logit range "
          "| top-1 agreement | top-5 overlap | weights (float32) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    mib, rows = 2.0 ** 20, []
    for variant in args.variants:
        for weights in ("init", "random"):
            for mode in args.modes:
                row = compare(variant, weights, images, mode)
                rows.append(row)
                with open(args.output, "w") as file:  # each row kept as soon as it is measured
                    json.dump(rows, file, indent=1)
                print(f"| CaiT_{row['variant']} | {row['weights']} | {row['mode']} "
                      f"| {row['relative_logit_change']:.2e} | {row['max_logit_change']:.2e} "
                      f"| {row['max_logit_change_over_range']:.2e} "
                      f"| {row['top1_agreement']:.0%} | {row['top5_overlap']:.0%} "
                      f"| {row['quantized_bytes'] / mib:.1f} MiB ({row['float32_bytes'] / mib:.1f} MiB) |",
                      flush=True)


if __name__ == "__main__":
    main()
