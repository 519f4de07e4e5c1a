"""LoRA against full fine-tuning on scikit-learn's bundled digits (offline): parameters, memory, accuracy.

    python scripts/lora_digits.py --output lora_digits.json

No pretrained CaiT can be downloaded here, so the transfer is made on the spot: a
small CaiT is pretrained on the digits 0-4, then a new head is fitted on the digits
5-9 (half of them; the other half is the test set) in one of four ways, each in its
own process so that its peak memory (the process's peak resident set, VmHWM)
is its own:

    head     the head only, the backbone frozen
    full     every weight
    lora-4   LoRA of rank 4 on the attention projections, and the head
    lora-8   the same at rank 8

Every mode has the same epochs, batch and seed; the learning rate is the usual one
for what is trained (1e-4 for full fine-tuning, 1e-3 for the head and LoRA).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODEL = dict(embed_dim=128, depth=4, num_heads=4, init_values=1e-5, patch_size=8, input_shape=(32, 32, 3))
MODES = {"head": 1e-3, "full": 1e-4, "lora-4": 1e-3, "lora-8": 1e-3}
SEED = 0


def digits(classes):
    """The 8×8 digits of `classes`, upscaled ×4 to 32×32 RGB 0..255, and their labels 0..n-1."""
    import numpy as np
    from sklearn.datasets import load_digits

    data = load_digits()
    keep = np.isin(data.target, classes)
    images = np.kron(data.images[keep], np.ones((4, 4))) * (255 / 16)
    images = np.repeat(images[..., None], 3, axis=-1).astype("float32")
    labels = np.searchsorted(classes, data.target[keep])
    order = np.random.RandomState(SEED).permutation(len(labels))
    return images[order], labels[order]


def pretrain(path, epochs):
    import keras

    from keras_cait.models.architecture import build_cait
    from keras_cait.training import with_new_head

    keras.utils.set_random_seed(SEED)
    images, labels = digits([0, 1, 2, 3, 4])
    model = build_cait(**MODEL, include_top=False, pooling="token")
    classifier = with_new_head(model, classes=5)
    classifier.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = classifier.fit(images, labels, batch_size=32, epochs=epochs, verbose=0)
    model.save_weights(path)
    return history.history["accuracy"][-1]


def peak_resident_mib():
    """This process's peak resident set (VmHWM); ru_maxrss would carry the parent's over exec."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def finetune(mode, pretrained, epochs):
    """One mode in this process: {trainable, parameters, accuracy, peak_rss_mib, seconds}."""
    import keras
    import numpy as np

    from keras_cait.models.architecture import build_cait
    from keras_cait.training import enable_lora, set_backbone_trainable, with_new_head

    keras.utils.set_random_seed(SEED)
    images, labels = digits([5, 6, 7, 8, 9])
    half = len(labels) // 2
    backbone = build_cait(**MODEL, include_top=False, pooling="token")
    backbone.load_weights(pretrained)
    model = with_new_head(backbone, classes=5)
    if mode == "head":
        set_backbone_trainable(model, False)
    elif mode.startswith("lora-"):
        enable_lora(model, rank=int(mode.split("-")[1]))
    model.compile(keras.optimizers.Adam(MODES[mode]), "sparse_categorical_crossentropy", metrics=["accuracy"])
    start = time.perf_counter()
    model.fit(images[:half], labels[:half], batch_size=32, epochs=epochs, verbose=0)
    seconds = time.perf_counter() - start
    predictions = model.predict(images[half:], batch_size=128, verbose=0).argmax(-1)
    return dict(
        mode=mode,
        learning_rate=MODES[mode],
        trainable=int(sum(np.prod(w.shape) for w in model.trainable_weights)),
        parameters=int(model.count_params()),
        train_images=half,
        test_images=len(labels) - half,
        accuracy=float((predictions == labels[half:]).mean()),
        peak_rss_mib=peak_resident_mib(),
        fit_seconds=seconds,
    )


def markdown(result):
    lines = ["| fine-tuning | trainable parameters | share | peak memory (RSS) | test accuracy | fit time |",
             "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(
            f"| {row['mode']} (lr {row['learning_rate']:g}) | {row['trainable']:,} | "
            f"{row['trainable'] / row['parameters']:.1%} | {row['peak_rss_mib']:.0f} MiB | "
            f"{row['accuracy']:.1%} | {row['fit_seconds']:.0f} s |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="the JSON file of the results")
    parser.add_argument("--pretrain-epochs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5, help="fine-tuning epochs of every mode")
    parser.add_argument("--mode", choices=["pretrain", *MODES], help=argparse.SUPPRESS)
    parser.add_argument("--pretrained", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Every step in a child process (its result as JSON on its last line): this one never
    # loads TensorFlow, whose resident memory the children would otherwise start from.
    if args.mode == "pretrain":
        print(json.dumps(pretrain(args.pretrained, args.pretrain_epochs)))
        return
    if args.mode:
        print(json.dumps(finetune(args.mode, args.pretrained, args.epochs)))
        return
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as workdir:
        pretrained = os.path.join(workdir, "pretrained.weights.h5")

        def child(mode):
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--output", args.output, "--mode", mode,
                 "--pretrained", pretrained, "--epochs", str(args.epochs),
                 "--pretrain-epochs", str(args.pretrain_epochs)],
                check=True, capture_output=True, text=True,
            )
            return json.loads(done.stdout.strip().splitlines()[-1])

        source_accuracy = child("pretrain")
        print(f"pretrained on digits 0-4: training accuracy {source_accuracy:.1%}", flush=True)
        rows = []
        for mode in MODES:
            rows.append(child(mode))
            print(f"  {mode}: {rows[-1]}", flush=True)
    result = dict(model=MODEL, pretrain_epochs=args.pretrain_epochs, epochs=args.epochs,
                  source_accuracy=source_accuracy, load_average_start=load_start,
                  load_average_end=os.getloadavg(), rows=rows)
    with open(args.output, "w") as file:
        json.dump(result, file, indent=1)
    print(markdown(result))


if __name__ == "__main__":
    main()
