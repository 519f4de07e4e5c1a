"""Time to the first prediction of `CaiT_S24(weights="imagenet")`, by the state of the caches.

    python -m benchmarks.hf_cache --rounds 3      # from the repository root (it uses tests/)

A fake Hugging Face hub on 127.0.0.1 (tests/weights/fake_hf_hub.py) serves a random
cait_s24_224 checkpoint in timm's format (188 MB, as the real one). Each
measurement is a fresh process that imports keras_cait (not timed) and then
times `CaiT_S24(weights="imagenet")` plus one `predict` of a 224×224 image:

- empty caches: downloaded from the fake hub into the HF cache, verified, loaded;
- warm HF cache (the file timm downloaded), online: one HEAD to the hub, no download;
- warm HF cache, HF_HUB_OFFLINE=1: no request at all;
- warm keras_cait cache: KERAS_CAIT_HUB_URL set (keras_cait's own downloader), the file in
  keras_cait's cache (filled once before the rounds), no request and no hashing.

The download is over loopback, so "empty" counts the hashing and loading but
hardly any network time. Prints a Markdown table of medians.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks.harness import with_repository

MEASURE = """
import sys, time, numpy as np, keras_cait
start = time.perf_counter()
model = keras_cait.CaiT_S24(weights="imagenet")
model.predict(np.zeros((1, 224, 224, 3), "float32"), verbose=0)
print(time.perf_counter() - start)
"""


def measure(env):
    done = subprocess.run([sys.executable, "-c", MEASURE], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main():
    import timm  # noqa: F401  before TensorFlow

    from tests.conftest import TimmReference
    from tests.weights.fake_hf_hub import FakeHub

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = tempfile.mkdtemp()
    try:
        import pathlib

        reference = TimmReference(pathlib.Path(work))
        body = reference.save(reference.model("cait_s24_224")).read_bytes()
        hub = FakeHub()
        hub.serve("cait_s24_224", body)
        hf_home, keras_home = os.path.join(work, "hf"), os.path.join(work, "keras")
        base = {name: value for name, value in with_repository().items() if not name.startswith("HF_")}
        base.update(HF_HOME=hf_home, HF_ENDPOINT=hub.url, KERAS_HOME=keras_home, TF_CPP_MIN_LOG_LEVEL="3")
        base.pop("KERAS_CAIT_HUB_URL", None)
        cases = {
            "empty caches (download from the fake hub)": (dict(base), True),
            "warm HF cache, online (HEAD only)": (dict(base), False),
            "warm HF cache, HF_HUB_OFFLINE=1": (dict(base, HF_HUB_OFFLINE="1"), False),
            # keras_cait's own cache, which the HF route neither reads nor clears.
            "warm keras_cait cache (KERAS_CAIT_HUB_URL)": (dict(base, KERAS_CAIT_HUB_URL=hub.url + "/timm"), False),
        }
        measure(cases["warm keras_cait cache (KERAS_CAIT_HUB_URL)"][0])  # fills keras_cait's cache
        times = {case: [] for case in cases}
        for _ in range(args.rounds):
            for case, (env, clear_hf) in cases.items():
                if clear_hf:
                    shutil.rmtree(os.path.join(hf_home, "hub"), ignore_errors=True)
                times[case].append(measure(env))
        hub.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"| cait_s24_224 (188 MB), {args.rounds} rounds, load average {load:.1f} | first prediction, median (min–max) |")
    print("|---|---|")
    for case, values in times.items():
        print(f"| {case} | {statistics.median(values):.1f} s ({min(values):.1f}–{max(values):.1f}) |")


if __name__ == "__main__":
    main()
