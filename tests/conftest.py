import functools
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# A suite started as a background job (`pytest ... &` in a script) runs with Ctrl-C ignored, and
# the commands its tests start would inherit that: the tests that interrupt them need the Ctrl-C
# of a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

try:
    # timm (through torchvision) must be imported before TensorFlow: in the other order
    # their LLVM copies clash and the process aborts.
    import timm  # noqa: F401
except ImportError:
    pass

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The smallest CaiT worth testing: 2x2 patches of 16, 2 blocks, width 64. The same
# arguments build a timm `Cait` (with img_size=32) and a Keras `build_cait` model.
TINY_CAIT = dict(embed_dim=64, depth=2, num_heads=4, init_values=0.1)
TINY_SIZE = 32


class TimmReference:
    """timm's CaiT with random weights: the PyTorch reference that keras_cait must match.

    Every parameter gets a non-trivial random value. Above all the LayerScale gammas:
    at their 1e-5 init every block is nearly the identity and a wrong attention would
    still match; here they are uniform in [0.2, 0.7]. Linear and conv weights are
    normal with std fan_in^-1/2 (so attention logits are O(1) and the softmax is far
    from uniform), LayerNorm weights are around 1, biases nonzero, the talking-heads
    mixes (`proj_l`, `proj_w`) are random H×H matrices like any other linear.

    Two choices make small deviations visible at the 1e-4 tolerance: `mlp.fc1` has
    twice that std, which puts the GELU inputs where its exact (erf) and tanh forms
    differ most (max |Δ| of logits 1.4e-4 with tanh on XXS24), and the class token
    keeps its real init scale (std ~0.01), so the first class-attention LayerNorm sees a
    token of small variance, where its eps matters (9e-4 with 1e-5 instead of 1e-6).
    """

    tiny_size = TINY_SIZE

    def __init__(self, directory):
        self.directory = directory

    @staticmethod
    def randomize(module, seed=0):
        import torch

        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in module.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf.startswith("gamma_"):
                    parameter.uniform_(0.2, 0.7, generator=generator)
                elif leaf == "bias":
                    parameter.uniform_(-0.2, 0.2, generator=generator)
                elif leaf == "weight" and parameter.ndim == 1:  # LayerNorm
                    parameter.uniform_(0.7, 1.3, generator=generator)
                elif leaf == "weight":  # Linear (out, in) or Conv2d (out, in, kh, kw)
                    gain = 2.0 if name.endswith("fc1.weight") else 1.0
                    parameter.normal_(0.0, gain * parameter[0].numel() ** -0.5, generator=generator)
                elif leaf == "cls_token":
                    parameter.normal_(0.0, 0.01, generator=generator)
                else:  # pos_embed
                    parameter.normal_(0.0, 0.5, generator=generator)
        return module

    def model(self, arch=None, seed=0, **kwargs):
        """A random timm CaiT: `arch` (e.g. "cait_s24_224") or, without it, `Cait(**kwargs)`.

        Built on the meta device and then allocated, which skips timm's own init:
        for M48 that init alone costs longer than the whole comparison.
        """
        import timm
        import timm.models.cait

        if arch is None:
            model = timm.models.cait.Cait(device="meta", **kwargs)
        else:
            model = timm.create_model(arch, device="meta", **kwargs)
        model = model.to_empty(device="cpu")
        return self.randomize(model, seed).eval()

    def tiny_model(self, seed=0, **kwargs):
        """A random timm CaiT of `TINY_CAIT`'s shape at 32x32."""
        return self.model(seed=seed, **{"img_size": TINY_SIZE, **TINY_CAIT, **kwargs})

    def save(self, model, name="model.safetensors"):
        """Writes `model`'s state_dict as safetensors under the test's directory; returns the path."""
        from safetensors.torch import save_file

        path = self.directory / name
        save_file({key: value.contiguous() for key, value in model.state_dict().items()}, str(path))
        return path

    @staticmethod
    def images(batch, height, width=None, seed=0):
        """Random RGB images, NHWC uint8 (what a Keras user feeds a model with preprocessing)."""
        rng = np.random.default_rng(seed)
        return rng.integers(0, 256, size=(batch, height, width or height, 3), dtype=np.uint8)

    @staticmethod
    def outputs(model, images):
        """timm's (logits, pre-logit class-token features) for NHWC 0..255 `images`.

        timm takes NCHW input normalised with the ImageNet mean and std of its
        pretrained config, which is what a Keras model with preprocessing does inside.
        """
        import torch
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        x = (images.astype("float32") / 255.0 - np.float32(IMAGENET_DEFAULT_MEAN)) / np.float32(
            IMAGENET_DEFAULT_STD
        )
        x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
        # One thread: the OpenMP workers of a second one spin for a core that pytest -n 2
        # (and anything else running) already uses, which made this 5-10x slower.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                features = model.forward_head(model.forward_features(x), pre_logits=True)
                logits = model.get_classifier()(features)
        finally:
            torch.set_num_threads(threads)
        return logits.numpy(), features.numpy()

    @staticmethod
    def assert_matches(actual, expected, what="output"):
        """float32 parity: max |Δ| ≤ 1e-4 × max |expected|."""
        actual, expected = np.asarray(actual), np.asarray(expected)
        assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
        scale = float(np.max(np.abs(expected)))
        error = float(np.max(np.abs(actual - expected)))
        assert scale > 0, f"{what}: the reference is all zeros, the comparison would prove nothing"
        print(f"{what}: max |Δ| / max |reference| = {error / scale:.1e}")
        assert error <= 1e-4 * scale, f"{what}: max |Δ| {error:.3g} > 1e-4 × max |reference| {scale:.3g}"


@pytest.fixture(scope="session")
def timm_checkpoint(tmp_path_factory):
    """`timm_checkpoint(arch)`: (a random timm model, its safetensors bytes), built once per
    session and arch, for the download tests, which serve the same checkpoint many times."""
    reference = TimmReference(tmp_path_factory.mktemp("checkpoints"))

    @functools.cache
    def build(arch):
        model = reference.model(arch)
        return model, reference.save(model, f"{arch}.safetensors").read_bytes()

    return build


@pytest.fixture
def timm_reference(tmp_path):
    """A `TimmReference` that saves its checkpoints under the test's tmp_path."""
    return TimmReference(tmp_path)


@pytest.fixture(scope="session")
def tiny_cait():
    """Builds a random Keras CaiT of `TINY_CAIT`'s shape at 32x32; keyword arguments override.

    A stateless builder, so session-scoped: module-scoped fixtures can use it too.
    """
    from keras_cait.models.architecture import build_cait

    def build(**changes):
        return build_cait(**{**TINY_CAIT, "input_shape": (TINY_SIZE, TINY_SIZE, 3), **changes})

    return build


@pytest.fixture
def keras_cache(tmp_path, monkeypatch):
    """Points the Keras cache (KERAS_HOME) at an empty folder; returns keras_cait's cache dir."""
    from keras_cait.weights import cache_dir

    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    return cache_dir()


@pytest.fixture
def no_network(monkeypatch):
    """Fails the test if anything tries to download."""
    import urllib.request

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"the test tried to download {url}; the error should come before")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.fixture(autouse=True)
def float32_after_each_test():
    """Every test starts under the float32 policy: a run called in-process (`runs.main`, `train_run`)
    sets the global policy to its --precision (mixed_float16 by default) and leaves it, as the
    command line does; a later test in the same worker would otherwise build in half precision."""
    yield
    import sys

    if "keras" in sys.modules:
        sys.modules["keras"].mixed_precision.set_global_policy("float32")


@pytest.fixture
def policy():
    """Sets a global dtype policy for one test and restores float32 afterwards."""
    import keras

    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


def write_digits(directory, per_class=None, size=32, classes=range(10)):
    """scikit-learn's bundled handwritten digits (8×8, 1797 images) as RGB PNGs in
    `directory/<digit>/`, upscaled to `size`; returns the directory."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts = {}
    for index, (image, label) in enumerate(zip(digits.images, digits.target)):
        if label not in classes or per_class is not None and counts.get(label, 0) >= per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        os.makedirs(os.path.join(directory, str(label)), exist_ok=True)
        pixels = (image * (255 / 16)).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").resize((size, size), Image.BICUBIC).save(
            os.path.join(directory, str(label), f"{index:04d}.png")
        )
    return str(directory)


@pytest.fixture(scope="session")
def digits():
    """`write_digits`, for tests that make their own folders of real images."""
    return write_digits


# The longest modules first: pytest-xdist hands tests out in collection order, and a long test
# handed out last keeps one worker busy while the other has nothing left (the training
# matrix's JAX cells alone take about 5 minutes).
LONGEST_FIRST = ("tests/training/test_training_matrix.py", "tests/test_parity.py", "tests/cli/test_demo.py",
                 "tests/benchmarks/test_training.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        module = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module stays whole and in its order

