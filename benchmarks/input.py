"""Training input pipelines on a CPU: keras_cait's training stream vs timm's DataLoader, in turns.

    python -m benchmarks.input --photos /tmp/photos --output input.json
    python -m benchmarks.input --smoke                      # few tiny photos, one round (a test)

Both read the same folder of real JPEGs and apply DeiT's training augmentation
(facebookresearch/deit main.py): keras_cait's `training_stream` with
`Augmentation(224, classes)` against timm's `create_transform(is_training=True,
...)` with DeiT's arguments in a torch `DataLoader`, then timm's `Mixup` on each
batch as DeiT's training loop does. tf.data gets a private thread pool of
`--cores` threads; the DataLoader `--cores` worker processes.

Where the time goes is read from cumulative stages, each a worker of its own:

    decode       read, decode, a centre crop (no resampling) to batch them
    crop         read, decode, RandomResizedCrop (bicubic), flip
    randaugment  + RandAugment (rand-m9-mstd0.5-inc1)
    erasing      + random erasing (0.25, per-pixel noise)
    full         + mixup/cutmix with label smoothing: DeiT's whole pipeline

A worker's speed is images/s of whole batches taken from the pipeline; the
workers are timed in turns by benchmarks/harness.py. Each turn starts a fresh
pipeline (a new tf.data iterator; a new DataLoader iterator, whose worker
processes start with it), takes its first batch untimed, counts the batches of
the turn and drops the pipeline: nothing works ahead while another worker is
timed, and no turn drains batches made before it began.
`--photos` is filled, if empty, with `--images` JPEGs of about 500×375 cut from
scikit-learn's two sample photos (random crops, scales and flips, quality 90).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from benchmarks import harness
from benchmarks.harness import Worker, load_all, machine_state, median_ratios, timed_rounds

STAGES = ("decode", "crop", "randaugment", "erasing", "full")
FRAMEWORKS = ("keras", "timm")
REFERENCE = "timm-full"
PACKAGES = ("torch", "torchvision", "timm", "tensorflow", "keras", "pillow")
# DeiT's training arguments (main.py defaults) as timm's create_transform and Mixup take them.
DEIT_TRANSFORM = dict(color_jitter=0.3, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                      re_prob=0.25, re_mode="pixel", re_count=1)
DEIT_MIXUP = dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch",
                  label_smoothing=0.1)


def make_photos(folder, count, seed=0):
    """`count` JPEGs of about 500×375 (landscape or portrait) from scikit-learn's sample photos,
    one class folder per photo."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = load_sample_images()
    for index in range(count):
        which = index % len(photos.images)
        photo = photos.images[which]
        height, width = photo.shape[:2]
        crop_height = int(height * rng.uniform(0.5, 1.0))
        crop_width = int(min(width, crop_height * rng.uniform(0.75, 1.5)))
        top, left = rng.integers(0, height - crop_height + 1), rng.integers(0, width - crop_width + 1)
        image = Image.fromarray(photo[top:top + crop_height, left:left + crop_width])
        size = (500, 375) if crop_width >= crop_height else (375, 500)
        image = image.resize(size, Image.BICUBIC)
        if rng.uniform() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        directory = os.path.join(folder, os.path.splitext(photos.filenames[which])[0].split(os.sep)[-1])
        os.makedirs(directory, exist_ok=True)
        image.save(os.path.join(directory, f"{index:05d}.jpg"), quality=90)


# === Pipelines: next_batch() of each framework at each stage ===


def keras_pipeline(stage, folder, image_size, batch_size, cores):
    import tensorflow as tf

    from keras_cait.images.evaluation_transform import decode_image
    from keras_cait.training import Augmentation, sources
    from keras_cait.training.stream import training_stream

    source = sources.image_folder(folder)
    if stage == "decode":
        def decode(*example):
            encoded, label = source.load(*example)
            return tf.image.resize_with_crop_or_pad(decode_image(encoded), image_size, image_size), label

        stream = source.examples.repeat().map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        stream = stream.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    else:
        upto = STAGES.index(stage)
        augmentation = Augmentation(
            image_size, source.num_classes,
            rand_augment_magnitude=Augmentation.rand_augment_magnitude if upto >= 2 else 0,
            random_erasing=Augmentation.random_erasing if upto >= 3 else 0,
            mixup_alpha=Augmentation.mixup_alpha if upto >= 4 else 0,
            cutmix_alpha=Augmentation.cutmix_alpha if upto >= 4 else 0,
        )
        stream = training_stream(source, augmentation, batch_size, epochs=10**6)
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    stream = stream.with_options(options)

    def pipeline():
        iterator = iter(stream)
        return lambda: next(iterator)

    return pipeline


def _pillow_posterize_to_zero_bits():
    """timm's RandAugment (inc1, magnitude noise) can posterize to 0 bits, which Pillow 13 (the
    version pinned here) refuses ("bits must be between or equal to 1 and 8") inside a DataLoader
    worker. A 0-bit posterize keeps no bit: answer with the black image it means, so the run
    times timm's transform instead of crashing."""
    from PIL import Image, ImageOps

    posterize = ImageOps.posterize

    def posterize_or_black(image, bits):
        return Image.new(image.mode, image.size) if bits < 1 else posterize(image, bits)

    ImageOps.posterize = posterize_or_black


def timm_pipeline(stage, folder, image_size, batch_size, cores):
    import torch
    from timm.data import Mixup, create_transform
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    _pillow_posterize_to_zero_bits()  # before the DataLoader forks its workers
    upto = STAGES.index(stage)
    if stage == "decode":
        transform = transforms.Compose([transforms.CenterCrop(image_size), transforms.PILToTensor()])
    else:
        # timm applies color_jitter only when auto_augment is off: the crop stage leaves both out,
        # as DeiT's pipeline (RandAugment on) never jitters.
        arguments = dict(DEIT_TRANSFORM, auto_augment=DEIT_TRANSFORM["auto_augment"] if upto >= 2 else None,
                         color_jitter=DEIT_TRANSFORM["color_jitter"] if upto >= 2 else None,
                         re_prob=DEIT_TRANSFORM["re_prob"] if upto >= 3 else 0.0)
        transform = create_transform(image_size, is_training=True, **arguments)
    dataset = ImageFolder(folder, transform)
    endless = torch.utils.data.RandomSampler(dataset, num_samples=10**9)  # epoch after epoch, reshuffled
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=endless, num_workers=cores,
                                         drop_last=True)
    mixup = Mixup(**DEIT_MIXUP, num_classes=len(dataset.classes)) if upto >= 4 else None

    def pipeline():
        iterator = iter(loader)  # starts `cores` worker processes; dropping it stops them

        def next_batch():
            images, labels = next(iterator)
            return mixup(images, labels) if mixup else (images, labels)

        return next_batch

    return pipeline


# === Worker and run ===


def worker(args):
    channel = harness.protocol_channel()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    framework, stage = args.worker.split("-", 1)
    start = time.perf_counter()
    if framework == "keras":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.cores)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        pipeline = keras_pipeline
    else:
        import torch

        torch.set_num_threads(1)  # the main process only collates and mixes; the workers decode
        pipeline = timm_pipeline
    harness.serve(channel, None, {args.batch_size: None}, outputs=False, warmups=1, started=start,
                        pipeline=pipeline(stage, args.photos, args.image_size, args.batch_size, args.cores))


def measure(args, logs):
    paths = [f"{framework}-{stage}" for stage in args.stages for framework in FRAMEWORKS]
    arguments = ["--photos", args.photos, "--image-size", str(args.image_size), "--batch-size",
                 str(args.batch_size), "--cores", str(args.cores)]
    workers = {path: Worker("benchmarks.input", path, arguments, os.path.join(logs, f"{path}.log")) for path in paths}
    load_all(workers, "input")
    speeds, _, memory = timed_rounds(workers, paths, [args.batch_size], args.rounds, args.seconds, "input")
    for worker_ in workers.values():
        worker_.close()
    rows = []
    for path in paths:
        samples = speeds[args.batch_size, path]
        reference = speeds[args.batch_size, path.replace("keras-", "timm-")]
        rows.append(dict(path=path, images_per_second=statistics.median(samples), rounds=samples,
                         images_per_second_per_core=statistics.median(samples) / args.cores,
                         ratio_to_timm=median_ratios(samples, reference), peak_memory_mb=memory[path]))
    return rows


def markdown(rows, cores):
    """Per stage: each side's img/s per core, keras / timm, and what the stage adds per image."""
    by = {row["path"]: row for row in rows}
    lines = ["| stages | keras_cait img/s per core | timm img/s per core | keras_cait / timm "
             "| keras_cait ms per image added | timm ms per image added |", "|---|---|---|---|---|---|"]
    previous = {}
    for stage in STAGES:
        if f"keras-{stage}" not in by:
            continue
        added = []
        for framework in FRAMEWORKS:
            row = by[f"{framework}-{stage}"]
            milliseconds = 1000 * cores / row["images_per_second"]  # core-milliseconds per image
            added.append(milliseconds - previous.get(framework, 0.0))
            previous[framework] = milliseconds
        keras_row, timm_row = by[f"keras-{stage}"], by[f"timm-{stage}"]
        lines.append(f"| {stage} | {keras_row['images_per_second_per_core']:.1f} "
                     f"| {timm_row['images_per_second_per_core']:.1f} | {keras_row['ratio_to_timm']:.2f}× "
                     f"| {added[0]:.1f} | {added[1]:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", help="folder of class folders of JPEGs; made if missing or empty")
    parser.add_argument("--images", type=int, default=400, help="photos to make (default: %(default)s)")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cores", type=int, default=2, help="tf.data threads = DataLoader worker processes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0, help="each worker's turn (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="tiny photos, small batches, one short round")
    parser.add_argument("--output", help="write the rows as JSON here")
    parser.add_argument("--logs", help="folder for the workers' logs (default: a temporary one)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.smoke:
        args.images, args.image_size, args.batch_size, args.rounds, args.seconds = 24, 32, 4, 1, 0.2
    load_average, started = os.getloadavg(), time.time()
    with tempfile.TemporaryDirectory() as scratch:
        args.photos = args.photos or os.path.join(scratch, "photos")
        if not os.path.isdir(args.photos) or not os.listdir(args.photos):
            make_photos(args.photos, args.images)
        rows = measure(args, args.logs or scratch)
    machine = machine_state(args.cores, args.rounds, args.seconds, load_average, started, PACKAGES)
    print(markdown(rows, args.cores))
    if args.output:
        harness.write_json({"machine": machine, "rows": rows}, args.output)


if __name__ == "__main__":
    sys.exit(main())
