"""Time to the first prediction and peak memory of `CaiTImageClassifier.from_preset(preset)`, per code tree.

Each measurement is a fresh process: `import keras_cait.hub`, `from_preset`, `predict` of one image,
against the fake Hugging Face hub of tests/weights/fake_hf_hub.py serving a random timm checkpoint
of the preset (no network), with caches that are empty (cold) or filled by the cold run (warm).
Trees are measured interleaved, `--repeats` times; the median is printed, with every run. Wall
times (`_s`) and the process's CPU times (`_cpu_s`, user + system, less sensitive to what else runs).

    git archive <commit> keras_cait | tar -x -C /tmp/before
    nice python -m tests.hub.measure_from_preset --preset cait_s24_224 /tmp/before .
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

import tests.conftest  # noqa: F401  timm before TensorFlow (the other order aborts)
from tests.conftest import TimmReference
from tests.weights.fake_hf_hub import FakeHub

# Peak memory from /proc/self/status (VmHWM): getrusage's ru_maxrss survives exec, so in a child
# it would report this parent's peak if that were higher.
CHILD = """
import json, re, sys, time
start, start_cpu = time.perf_counter(), time.process_time()
import numpy as np
import keras_cait.hub
imported, imported_cpu = time.perf_counter(), time.process_time()
classifier = keras_cait.hub.CaiTImageClassifier.from_preset(sys.argv[1])
loaded, loaded_cpu = time.perf_counter(), time.process_time()
classifier.predict(np.zeros((1, 224, 224, 3), "uint8"), verbose=0)
done, done_cpu = time.perf_counter(), time.process_time()
print(json.dumps(dict(import_s=imported - start, from_preset_s=loaded - imported, predict_s=done - loaded,
                      first_prediction_s=done - start, from_preset_cpu_s=loaded_cpu - imported_cpu,
                      first_prediction_cpu_s=done_cpu - start_cpu,
                      peak_rss_mib=int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1]) / 1024)))
"""


def measure(tree, preset, home, hub_url):
    env = {name: value for name, value in os.environ.items() if not name.startswith(("HF_", "KERAS_"))}
    env.update(PYTHONPATH=os.path.abspath(tree), HF_HOME=os.path.join(home, "hf_home"),
               KERAS_HOME=os.path.join(home, "keras_home"), HF_ENDPOINT=hub_url, TF_CPP_MIN_LOG_LEVEL="3",
               KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, "-c", CHILD, preset], env=env, capture_output=True, text=True,
                          cwd=home, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{tree}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", help="folders holding a keras_cait package")
    parser.add_argument("--preset", default="cait_s24_224")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from keras_cait.weights import CHECKPOINTS

    if CHECKPOINTS[args.preset]["sha256"]:
        parser.error(f"{args.preset} has a pinned sha256, which a random checkpoint cannot match; "
                     "pick one without, e.g. cait_s24_224.")
    with tempfile.TemporaryDirectory() as work:
        reference = TimmReference(pathlib.Path(work))
        body = reference.save(reference.model(args.preset)).read_bytes()  # the model is freed here
        hub = FakeHub()
        hub.serve(args.preset, body)
        runs = {(tree, state): [] for tree in args.trees for state in ("cold", "warm")}
        for repeat in range(args.repeats):
            for tree in args.trees:
                home = tempfile.mkdtemp(dir=work)
                for state in ("cold", "warm"):
                    runs[tree, state].append(measure(tree, args.preset, home, hub.url))
        hub.close()
    for (tree, state), results in runs.items():
        medians = {key: round(statistics.median(r[key] for r in results), 2) for key in results[0]}
        print(json.dumps(dict(tree=tree, preset=args.preset, cache=state, median=medians, runs=results)))


if __name__ == "__main__":
    main()
