"""weights="imagenet" (download, verification, cache) and weights files of every kind.

The Hugging Face hub is replaced by a local http.server on 127.0.0.1 (KERAS_CAIT_HUB_URL)
serving random-weight checkpoints in timm's format, and the cache by an empty KERAS_HOME.
"""

import hashlib
import http.server
import os
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.weights import CHECKPOINTS, load_weights_file
from keras_cait.weights.registry import HUB_URL_ENV, TAG


class Hub:
    """A stand-in for the hub: serves `model.safetensors` of the archs given to `serve`."""

    def __init__(self):
        self.files = {}
        self.redirects = {}
        self.responders = {}  # path -> function(handler) that answers in its own way
        self.requests = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hub.requests.append(self.path)
                if self.path in hub.responders:
                    hub.responders[self.path](self)
                    return
                if self.path in hub.redirects:  # as huggingface.co: the hash rides on the 302
                    location, headers = hub.redirects[self.path]
                    self.send_response(302)
                    for name, value in {"Location": location, "Content-Length": "0", **headers}.items():
                        self.send_header(name, value)
                    self.end_headers()
                    return
                if self.path not in hub.files:
                    self.send_error(404)
                    return
                body, headers = hub.files[self.path]
                self.send_response(200)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def path(arch):
        return f"/{arch}.{TAG}/resolve/main/model.safetensors"

    def serve(self, arch, body, headers=None):
        """Serves `body` as `arch`'s file with `headers` (Content-Length: its size, unless given)."""
        self.files[self.path(arch)] = (body, headers or {})

    def serve_via_cdn(self, arch, body, hub_headers, cdn_body=None):
        """As huggingface.co: the file's URL answers 302 with `hub_headers` (X-Linked-Etag,
        X-Linked-Size), and the redirect's target, another path, sends `cdn_body` (default
        `body`) with a Content-Length only."""
        cdn_path = f"/cdn/{arch}/{sha256(body)}"
        self.redirects[self.path(arch)] = (self.url + cdn_path, hub_headers)
        self.files[cdn_path] = (body if cdn_body is None else cdn_body, {})

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(monkeypatch, keras_cache):
    server = Hub()
    monkeypatch.setenv(HUB_URL_ENV, server.url)
    yield server
    server.close()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def logits(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


def cached_files(cache):
    """The files of keras_cait's cache, but the sha256 recorded beside each entry (`.<name>.sha256`)."""
    if not os.path.isdir(cache):
        return []
    return sorted(name for name in os.listdir(cache) if not (name.startswith(".") and name.endswith(".sha256")))


@pytest.mark.large
def test_imagenet_downloads_once_verifies_the_pinned_hash_and_caches_the_checkpoint(
    hub, keras_cache, timm_reference, monkeypatch
):
    reference = timm_reference.model("cait_xxs24_224")
    body = timm_reference.save(reference).read_bytes()
    monkeypatch.setitem(CHECKPOINTS["cait_xxs24_224"], "sha256", sha256(body))
    hub.serve("cait_xxs24_224", body)
    images = timm_reference.images(2, 224)
    expected, _ = timm_reference.outputs(reference, images)

    first = keras_cait.CaiT_XXS24(weights="imagenet", classifier_activation=None)

    timm_reference.assert_matches(logits(first, images), expected, "logits")
    assert hub.requests == [Hub.path("cait_xxs24_224")]
    assert cached_files(keras_cache) == [f"cait_xxs24_224.{TAG}.safetensors"]

    second = keras_cait.CaiT_XXS24(weights="imagenet", classifier_activation=None)

    assert len(hub.requests) == 1, "the second model must come from the cache"
    np.testing.assert_array_equal(logits(second, images), logits(first, images))


@pytest.mark.large
def test_pinned_sha256_wins_over_the_server(hub, keras_cache, timm_reference):
    """cait_xxs24_224's real hash is pinned: a file with another hash is refused, even
    when the server vouches for it."""
    body = timm_reference.save(timm_reference.model("cait_xxs24_224")).read_bytes()
    hub.serve("cait_xxs24_224", body, {"X-Linked-Etag": f'"{sha256(body)}"'})

    with pytest.raises(OSError, match="sha256") as error:
        keras_cait.CaiT_XXS24(weights="imagenet")

    assert CHECKPOINTS["cait_xxs24_224"]["sha256"] in str(error.value)
    assert "pinned" in str(error.value)
    assert cached_files(keras_cache) == []


@pytest.mark.large
def test_384_request_takes_the_384_checkpoint_verified_by_the_hub_headers(
    hub, keras_cache, timm_reference
):
    reference = timm_reference.model("cait_xxs24_384")
    body = timm_reference.save(reference).read_bytes()
    headers = {"X-Linked-Etag": f'"{sha256(body)}"', "X-Linked-Size": str(len(body))}
    hub.serve("cait_xxs24_384", body, headers)
    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(reference, images)

    model = keras_cait.CaiT_XXS24(
        weights="imagenet", input_shape=(384, 384, 3), classifier_activation=None
    )

    assert hub.requests == [Hub.path("cait_xxs24_384")]
    timm_reference.assert_matches(logits(model, images), expected, "logits")
    assert cached_files(keras_cache) == [f"cait_xxs24_384.{TAG}.safetensors"]


@pytest.mark.large
def test_unreleased_resolution_takes_the_nearest_checkpoint_and_resizes(
    hub, keras_cache, timm_reference
):
    import torch

    reference = timm_reference.model("cait_xxs24_384")
    body = timm_reference.save(reference).read_bytes()
    hub.serve("cait_xxs24_384", body, {"X-Linked-Etag": sha256(body)})
    grid = reference.pos_embed.detach().reshape(1, 24, 24, 192).permute(0, 3, 1, 2)
    resized = torch.nn.functional.interpolate(grid, size=(20, 20), mode="bicubic", align_corners=False)

    model = keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(320, 320, 3))

    assert hub.requests == [Hub.path("cait_xxs24_384")], "384 is nearer to 320 than 224"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.get_layer("position_embedding").embeddings),
        resized.permute(0, 2, 3, 1).reshape(1, 400, 192).numpy(),
        atol=1e-5,
    )


def test_corrupted_download_fails_the_hash_check_and_leaves_the_cache_clean(
    hub, keras_cache, timm_reference
):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    corrupted = bytearray(body)
    corrupted[len(body) // 2] ^= 0xFF
    hub.serve("cait_xxs24_384", bytes(corrupted), {"X-Linked-Etag": f'"{sha256(body)}"'})

    with pytest.raises(OSError, match="corrupted: its sha256 is") as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert sha256(body) in str(error.value)
    assert cached_files(keras_cache) == []


@pytest.mark.large
@pytest.mark.parametrize(
    "header", ["Content-Length", "X-Linked-Size"], ids=["content_length", "x_linked_size"]
)
def test_truncated_download_fails_and_leaves_the_cache_clean(hub, keras_cache, timm_reference, header):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    full_size = str(len(body))
    truncated = body[: len(body) // 2]
    hub.serve("cait_xxs24_384", truncated, {"X-Linked-Etag": sha256(body), header: full_size})

    with pytest.raises(OSError, match=f"incomplete: {len(truncated)} of {full_size} bytes"):
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert cached_files(keras_cache) == []


def test_file_of_another_variant_is_refused_naming_the_keys(hub, keras_cache, timm_reference):
    """A shallower CaiT's file (a larger one, such as XXS36's, is refused by its size first:
    tests/weights/test_download.py)."""
    shallower = timm_reference.model(img_size=384, embed_dim=192, depth=20, num_heads=4, init_values=1e-5)
    body = timm_reference.save(shallower).read_bytes()
    hub.serve("cait_xxs24_384", body, {"X-Linked-Etag": sha256(body)})

    with pytest.raises(ValueError, match=r"missing keys: blocks\.2[0-3]\.") as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert f"file downloaded from {hub.url}" in str(error.value)
    assert cached_files(keras_cache) == []


def test_keras_weights_file_of_the_same_variant_loads(tmp_path, timm_reference, tiny_cait):
    source = tiny_cait()
    path = str(tmp_path / "tiny.weights.h5")
    source.save_weights(path)
    target = tiny_cait()
    images = timm_reference.images(2, timm_reference.tiny_size)

    load_weights_file(target, path)

    np.testing.assert_array_equal(logits(target, images), logits(source, images))


def test_a_timm_checkpoint_without_its_head_says_how_to_load_it(timm_reference, tiny_cait):
    """It was "missing keys: head.bias, head.weight. Is it a checkpoint of another CaiT variant?"."""
    from safetensors.numpy import load_file, save_file

    path = timm_reference.save(timm_reference.tiny_model())
    save_file({key: value for key, value in load_file(path).items() if not key.startswith("head.")}, path)
    with pytest.raises(ValueError) as raised:
        load_weights_file(tiny_cait(), path)
    assert str(raised.value).endswith("holds no head (head.weight, head.bias), and the model 'cait' has one: give "
                                      "include_top=False for its features, or classes=N for a new head of N classes.")
    load_weights_file(tiny_cait(include_top=False), path)


@pytest.mark.parametrize("changes", [dict(depth=3), dict(embed_dim=96)], ids=["depth", "width"])
def test_keras_weights_file_of_another_variant_is_refused(tmp_path, tiny_cait, changes):
    path = str(tmp_path / "tiny.weights.h5")
    tiny_cait().save_weights(path)

    with pytest.raises(ValueError, match="does not fit the model.*another CaiT variant") as raised:
        load_weights_file(tiny_cait(**changes), path)
    # Each side named only where it has tensors the other lacks: a deeper model lacks none of the file's ({} before)
    assert ("the file has tensors of shapes" in str(raised.value)) == ("embed_dim" in changes)
    assert "the model has tensors of shapes" in str(raised.value) and "{}" not in str(raised.value)


def test_keras_weights_file_with_another_head_names_its_classes(tmp_path, tiny_cait):
    """Keras' own error ("A total of 1 objects could not be loaded", the variable's values dumped)
    after a UserWarning that the layers would keep their initial weights."""
    from keras_cait.errors import ArgumentError
    from keras_cait.models.surgery import with_new_head

    five, headless = str(tmp_path / "five.weights.h5"), str(tmp_path / "headless.weights.h5")
    tiny_cait(classes=5).save_weights(five)
    tiny_cait(include_top=False).save_weights(headless)
    with pytest.raises(ArgumentError) as raised:
        load_weights_file(tiny_cait(classes=7), five)
    # load_weights_file's argument is `path` (the constructors' `weights=` is named by them)
    assert str(raised.value) == (f"path={five!r}: has a head of 5 classes, the model one of 7; give classes=5, "
                                 "or include_top=False to load all but the head")
    with pytest.raises(ArgumentError) as raised:
        load_weights_file(tiny_cait(classes=7), headless)
    assert str(raised.value) == (f"path={headless!r}: holds no head (saved from a model built with "
                                 "include_top=False); give include_top=False for its features, or classes=N for a "
                                 "new head of N classes")
    backbone = str(tmp_path / "xxs24_backbone.weights.h5")  # the advice works: classes=N, a new head on it
    keras_cait.CaiT_XXS24(weights=None, include_top=False, input_shape=(32, 32, 3)).save_weights(backbone)
    assert keras_cait.models.load_classifier("XXS24", weights=backbone, image_size=32, classes=3).output_shape == (
        None, 3)
    for model in (tiny_cait(classes=5), tiny_cait(include_top=False)):  # the same head, or none: loaded
        load_weights_file(model, five)
    tuned = str(tmp_path / "tuned.weights.h5")
    with_new_head(tiny_cait(include_top=False, pooling="token"), 4).save_weights(tuned)
    load_weights_file(tiny_cait(classes=4), tuned)


def test_an_empty_or_unknown_weights_file_is_named_by_the_caller_s_argument(tmp_path, tiny_cait):
    """An empty .weights.h5 was said to hold "no head", and load_weights_file(path=...) named `weights=`."""
    import h5py

    from keras_cait.errors import ArgumentError

    empty, other = str(tmp_path / "empty.weights.h5"), str(tmp_path / "w.npz")
    h5py.File(empty, "w").close()
    np.savez(other, a=np.zeros(1))
    for call, line in [
        (lambda: load_weights_file(tiny_cait(), path=empty),
         f"path={empty!r}: holds no weights at all (an empty .weights.h5 file); save them again: "
         "model.save_weights(path)"),
        (lambda: load_weights_file(tiny_cait(), other),
         f"path={other!r}: is a file of a kind keras_cait reads no weights from; give a .safetensors or .pth "
         "checkpoint (timm/DeiT) or a Keras .weights.h5 file"),
        (lambda: keras_cait.CaiT_XXS24(weights=empty, input_shape=(32, 32, 3)),
         f"weights={empty!r}: holds no weights at all (an empty .weights.h5 file); save them again: "
         "model.save_weights(path)"),
    ]:
        with pytest.raises(ArgumentError) as raised:
            call()
        assert str(raised.value) == line


def test_timm_checkpoint_conversion_is_strict_about_keys_and_shapes(timm_reference, tiny_cait):
    """A checkpoint that fits the model but for a missing, an extra and a reshaped key."""
    from safetensors.numpy import load_file, save_file

    path = timm_reference.save(timm_reference.tiny_model())
    state = load_file(path)
    del state["blocks.1.gamma_2"]
    state["blocks.7.gamma_1"] = np.ones(64, "float32")
    state["head.bias"] = np.zeros(10, "float32")
    save_file(state, path)

    with pytest.raises(ValueError) as error:
        load_weights_file(tiny_cait(), path)

    message = str(error.value)
    assert "missing keys: blocks.1.gamma_2" in message
    assert "unexpected keys: blocks.7.gamma_1" in message
    assert "shape does not fit: head.bias (10,)" in message


def test_timm_checkpoint_loads_into_a_headless_model(timm_reference, tiny_cait):
    """Without the top, the checkpoint's head is the one part that may be left out."""
    reference = timm_reference.tiny_model()
    path = timm_reference.save(reference)
    images = timm_reference.images(2, timm_reference.tiny_size)
    _, features = timm_reference.outputs(reference, images)
    model = tiny_cait(include_top=False, pooling="token")

    load_weights_file(model, path)

    timm_reference.assert_matches(logits(model, images), features, "features")


def test_timm_checkpoint_of_a_non_square_grid_matches_timm(timm_reference, tiny_cait):
    """A 2×3 patch grid (32×48 images) loads as it is: timm and Keras agree."""
    reference = timm_reference.tiny_model(img_size=(32, 48))
    path = timm_reference.save(reference)
    images = timm_reference.images(2, 32, 48)
    expected, _ = timm_reference.outputs(reference, images)
    model = tiny_cait(input_shape=(32, 48, 3), classifier_activation=None)

    load_weights_file(model, path)

    timm_reference.assert_matches(logits(model, images), expected, "logits")


@pytest.mark.parametrize("stated_in", ["metadata", "argument"])
def test_timm_checkpoint_of_a_non_square_grid_is_resampled_from_its_stated_grid(
    timm_reference, tiny_cait, stated_in
):
    import torch.nn.functional as F
    from safetensors.numpy import load_file, save_file

    reference = timm_reference.tiny_model(img_size=(32, 48))  # 2×3 patches
    path = timm_reference.save(reference)
    state = load_file(path)
    save_file(state, path, metadata={"grid_size": "2,3"} if stated_in == "metadata" else None)
    model = tiny_cait(input_shape=(64, 64, 3))  # 4×4 patches

    load_weights_file(model, path, source_grid=(2, 3) if stated_in == "argument" else None)

    grid = reference.pos_embed.detach().double().reshape(1, 2, 3, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(4, 4), mode="bicubic", align_corners=False)
    expected = expected.permute(0, 2, 3, 1).reshape(1, 16, -1).numpy()
    got = keras.ops.convert_to_numpy(model.get_layer("position_embedding").embeddings)
    assert np.max(np.abs(got - expected)) <= 1e-6 * np.max(np.abs(expected))


@pytest.mark.parametrize("stated, line", [
    ("0,4", "metadata grid_size='0,4' is not 'rows,cols' of two positive sides, e.g. '14,14'."),
    ("2,x", "metadata grid_size='2,x' is not 'rows,cols' of two positive sides, e.g. '14,14'."),
    ("3,3", "metadata grid_size='3,3' states 9 positions, but its pos_embed holds 6; save the weights again "
            "from the model they belong to."),
])
def test_a_checkpoint_stating_a_grid_its_position_embedding_cannot_have_is_refused_naming_the_file(
        timm_reference, tiny_cait, stated, line):
    """It was refused as `source_grid=(0, 4)`, an argument the caller never gave, or in words naming
    neither the file nor its metadata."""
    from safetensors.numpy import load_file, save_file

    path = timm_reference.save(timm_reference.tiny_model(img_size=(32, 48)))  # 6 positions
    save_file(load_file(path), path, metadata={"grid_size": stated})
    with pytest.raises(ValueError) as raised:
        load_weights_file(tiny_cait(input_shape=(64, 64, 3)), path)
    assert str(raised.value) == f"{path}: {line}"


def test_timm_checkpoint_whose_grid_fits_no_token_count_is_refused(timm_reference, tiny_cait):
    path = timm_reference.save(timm_reference.tiny_model(img_size=(32, 48)))  # 6 positions
    with pytest.raises(ValueError, match=r"shape \(1, 6, 64\).*3×3"):
        load_weights_file(tiny_cait(input_shape=(64, 64, 3)), path, source_grid=(3, 3))
    with pytest.raises(ValueError, match=r"shape \(1, 6, 64\).*not a square"):
        load_weights_file(tiny_cait(input_shape=(64, 64, 3)), path)


@pytest.mark.parametrize("grid", [14, (14,), (2, 3, 1), "2,3", (2.0, 3), (0, 6), (-2, -3), (True, 6)])
def test_a_source_grid_that_is_no_pair_of_positive_ints_is_refused_by_name(timm_reference, tiny_cait, grid):
    from keras_cait.errors import ArgumentError

    path = timm_reference.save(timm_reference.tiny_model(img_size=(32, 48)))  # 2×3 patches
    model = tiny_cait(input_shape=(64, 64, 3))
    before = [keras.ops.convert_to_numpy(weight) for weight in model.weights]
    with pytest.raises(ArgumentError, match=r"^source_grid=.*: must be the \(rows, cols\) patch grid") as caught:
        load_weights_file(model, path, source_grid=grid)
    assert caught.value.argument == "source_grid"
    assert all(np.array_equal(keras.ops.convert_to_numpy(weight), value)
               for weight, value in zip(model.weights, before))


def test_a_source_grid_given_with_a_keras_weights_file_is_refused(tiny_cait, tmp_path):
    from keras_cait.errors import ArgumentError

    model = tiny_cait()
    path = str(tmp_path / "tiny.weights.h5")
    model.save_weights(path)
    with pytest.raises(ArgumentError, match=r"^source_grid=\(2, 3\): is for timm/DeiT checkpoints; .*records its own grid"):
        load_weights_file(model, path, source_grid=(2, 3))
    load_weights_file(model, path, source_grid=None)


@pytest.mark.large
def test_a_file_missing_on_the_server_is_reported_with_its_status(hub, keras_cache):
    with pytest.raises(ConnectionError, match=r"answered 404 .*cait_xxs24_224\.fb_dist_in1k.*weights='/path/to/model\.safetensors'"):
        keras_cait.CaiT_XXS24(weights="imagenet")
    assert cached_files(keras_cache) == []


def hub_headers(body):
    return {"X-Linked-Etag": f'"{sha256(body)}"', "X-Linked-Size": str(len(body))}


@pytest.mark.large
def test_hash_from_the_hubs_redirect_verifies_the_cdn_body(hub, keras_cache, timm_reference):
    reference = timm_reference.model("cait_xxs24_384")
    body = timm_reference.save(reference).read_bytes()
    hub.serve_via_cdn("cait_xxs24_384", body, hub_headers(body))
    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(reference, images)

    model = keras_cait.CaiT_XXS24(
        weights="imagenet", input_shape=(384, 384, 3), classifier_activation=None
    )

    assert hub.requests == [Hub.path("cait_xxs24_384"), f"/cdn/cait_xxs24_384/{sha256(body)}"]
    timm_reference.assert_matches(logits(model, images), expected, "logits")
    assert cached_files(keras_cache) == [f"cait_xxs24_384.{TAG}.safetensors"]


@pytest.mark.large
def test_altered_cdn_body_is_refused_by_the_hubs_hash(hub, keras_cache, timm_reference):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    altered = bytearray(body)
    altered[len(body) // 3] ^= 0x01  # same size, still a valid safetensors file
    hub.serve_via_cdn("cait_xxs24_384", body, hub_headers(body), cdn_body=bytes(altered))

    with pytest.raises(OSError, match="corrupted: its sha256 is") as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert f"X-Linked-Etag) is {sha256(body)}" in str(error.value)
    assert cached_files(keras_cache) == []


def test_a_server_without_a_hash_for_an_unpinned_file_is_refused_before_downloading(
    hub, keras_cache, timm_reference
):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    hub.serve("cait_xxs24_384", body)  # a mirror: 200, Content-Length, no X-Linked-Etag

    with pytest.raises(OSError, match="Cannot verify") as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert "weights='/path/to/model.safetensors'" in str(error.value)
    assert cached_files(keras_cache) == []


@pytest.mark.parametrize(
    "damage", [lambda b: b[: len(b) // 2], lambda b: b"", lambda b: os.urandom(4096)],
    ids=["truncated", "empty", "random_bytes"],
)
def test_an_unreadable_safetensors_file_is_named_in_the_error(tmp_path, tiny_cait, damage):
    from safetensors.numpy import save

    path = tmp_path / "broken.safetensors"
    path.write_bytes(damage(save({"cls_token": np.ones((1, 1, 64), "float32")})))

    with pytest.raises(ValueError, match="not a readable safetensors checkpoint") as error:
        keras_cait.CaiT_XXS24(weights=str(path), input_shape=(32, 32, 3))

    assert str(path) in str(error.value)
    # One traceback: safetensors' own error, whose text the message says, is kept as `cause`, not chained.
    assert error.value.__cause__ is None and error.value.__suppress_context__ and error.value.cause is not None
    from keras_cait.weights.convert import checkpoint_grid  # the metadata's reader, reached first by load_weights_file

    with pytest.raises(ValueError, match="not a readable safetensors checkpoint") as error:
        checkpoint_grid(path)
    assert error.value.__cause__ is None and error.value.__suppress_context__ and error.value.cause is not None


@pytest.mark.large
def test_a_truncated_cached_weights_file_is_downloaded_again(hub, keras_cache, timm_reference):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    hub.serve_via_cdn("cait_xxs24_384", body, hub_headers(body))
    first = keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))
    cached = os.path.join(keras_cache, f"cait_xxs24_384.{TAG}.safetensors")
    with open(cached, "r+b") as file:
        file.truncate(os.path.getsize(cached) // 2)

    with pytest.warns(UserWarning, match=f"{cached} are unreadable"):
        again = keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert len(hub.requests) == 4, "downloaded twice: hub and CDN each time"
    images = timm_reference.images(1, 384)
    np.testing.assert_array_equal(logits(again, images), logits(first, images))


def test_a_truncated_keras_weights_file_is_named_in_the_error(tmp_path, tiny_cait):
    path = str(tmp_path / "model.weights.h5")
    tiny_cait().save_weights(path)
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)

    with pytest.raises(ValueError, match="not a readable Keras .weights.h5 file") as error:
        load_weights_file(tiny_cait(), path)

    assert path in str(error.value)


@pytest.mark.large
def test_stale_downloads_of_dead_processes_are_removed(hub, keras_cache, timm_reference):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    hub.serve_via_cdn("cait_xxs24_384", body, hub_headers(body))
    os.makedirs(keras_cache)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    leftover = os.path.join(keras_cache, f".cait_xxs24_384.partial-{dead}-x1y2z3w4.safetensors")
    alive = os.path.join(keras_cache, f".cait_xxs24_384.partial-{os.getppid()}-x1y2z3w4.safetensors")
    for path in (leftover, alive):
        with open(path, "wb") as file:
            file.write(body[:100])

    keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert cached_files(keras_cache) == sorted(
        [os.path.basename(alive), f"cait_xxs24_384.{TAG}.safetensors"]
    )


def test_official_pth_names_are_the_files_the_cait_authors_released():
    from keras_cait.weights import registry

    names = [registry.official_pth(arch).removeprefix("https://dl.fbaipublicfiles.com/deit/")
             for arch in registry.CHECKPOINTS]
    assert names == [  # /work/shared/reference/cait_weights.md, timm's default_cfgs
        "XXS24_224.pth", "XXS24_384.pth", "XXS36_224.pth", "XXS36_384.pth", "XS24_384.pth",
        "S24_224.pth", "S24_384.pth", "S36_384.pth", "M36_384.pth", "M48_448.pth",
    ]


@pytest.mark.large
def test_a_relative_redirect_within_the_hub_is_followed_for_the_hash(hub, keras_cache, timm_reference):
    body = timm_reference.save(timm_reference.model("cait_xxs24_384")).read_bytes()
    hub.serve_via_cdn("cait_xxs24_384", body, hub_headers(body))
    renamed = "/timm/renamed/resolve/main/model.safetensors"
    hub.redirects[renamed] = hub.redirects.pop(Hub.path("cait_xxs24_384"))
    hub.redirects[Hub.path("cait_xxs24_384")] = (renamed, {})  # no hash on this one

    keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    assert hub.requests[:2] == [Hub.path("cait_xxs24_384"), renamed]
    assert cached_files(keras_cache) == [f"cait_xxs24_384.{TAG}.safetensors"]


class Pickled:
    """A class torch.load(weights_only=True) must refuse to rebuild."""


@pytest.mark.parametrize("content, held", [
    ({"model": {"a": 1}}, "a dict whose entry 'a' is a int"),
    ([1, 2], "a list"),
    ({"model": [1]}, "a list"),
    ({"blocks.0.norm1.weight": "text"}, "entry 'blocks.0.norm1.weight' is a str"),
], ids=["dict_of_int", "list", "model_list", "string_value"])
def test_a_pth_that_is_not_a_state_dict_is_named_in_the_error(tmp_path, tiny_cait, content, held):
    import torch

    path = str(tmp_path / "odd.pth")
    torch.save(content, path)

    with pytest.raises(ValueError, match="not a state_dict") as error:
        load_weights_file(tiny_cait(), path)

    assert path in str(error.value) and held in str(error.value)


@pytest.mark.parametrize("content", [b"hello", b"", "random"], ids=["text", "empty", "random_bytes"])
def test_a_pth_that_is_no_pytorch_file_is_named_unreadable_not_pickled_code(tmp_path, tiny_cait, content):
    """A text file gave a bare `KeyError: 101`, random bytes the pickled-code message."""
    path = tmp_path / "notes.pth"
    path.write_bytes(os.urandom(5000) if content == "random" else content)
    with pytest.raises(ValueError, match=r"notes.pth \(\d+ bytes\) is not a readable PyTorch checkpoint: ") as error:
        load_weights_file(tiny_cait(), str(path))
    assert "pickled code" not in str(error.value) and "\n" not in str(error.value)


def test_a_pth_with_pickled_objects_is_refused_without_advice_to_run_them(tmp_path, tiny_cait):
    import torch

    path = str(tmp_path / "evil.pth")
    torch.save({"model": Pickled()}, path)

    with pytest.raises(ValueError, match="was not loaded") as error:
        load_weights_file(tiny_cait(), path)

    assert path in str(error.value)
    assert "weights_only=False" not in str(error.value)


@pytest.mark.large
@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("kind", ["safetensors", "weights.h5"])
def test_weights_holding_nan_or_inf_are_refused_naming_the_tensor(
    tmp_path, timm_reference, tiny_cait, kind, value
):
    from safetensors.numpy import load_file, save_file

    if kind == "safetensors":
        path = str(timm_reference.save(timm_reference.tiny_model()))
        state = load_file(path)
        state["blocks.1.mlp.fc2.bias"][3] = value
        save_file(state, path)
        named = "blocks.1.mlp.fc2.bias"
    else:
        source = tiny_cait()
        variable = source.get_layer("final_norm").gamma
        variable.assign(np.where(np.arange(variable.shape[0]) == 3, value, variable.numpy()))
        path = str(tmp_path / "model.weights.h5")
        source.save_weights(path)
        named = "final_norm"
    model = tiny_cait()
    before = [w.numpy() for w in model.weights]

    with pytest.raises(ValueError, match="NaN or inf in 1 tensor") as error:
        load_weights_file(model, path)

    assert named in str(error.value) and "allow_nonfinite=True" in str(error.value)
    for kept, weight in zip(before, model.weights):
        np.testing.assert_array_equal(weight.numpy(), kept)  # nothing was assigned
    with pytest.raises(ValueError, match=r"^allow_nonfinite='no': must be True \(load NaN or inf as they are\) or "
                                         r"False \(refuse them\), not str$"):
        load_weights_file(model, path, allow_nonfinite="no")  # a str from a config was truthy: NaN loaded
    for kept, weight in zip(before, model.weights):
        np.testing.assert_array_equal(weight.numpy(), kept)
    load_weights_file(model, path, allow_nonfinite=True)
    assert not np.isfinite(logits(model, timm_reference.images(1, timm_reference.tiny_size))).all()


def test_load_weights_file_given_no_path_or_a_folder_names_path(tmp_path, tiny_cait):
    """`path`, as the caller gave it: it used to be a bare TypeError from os.fspath, and a folder
    `weights='...': no such file`, the constructors' argument."""
    from keras_cait.errors import ArgumentError
    from keras_cait.weights.convert import load_state_dict

    model = tiny_cait()
    with pytest.raises(ArgumentError, match=r"^path=None: must be the path of a weights file, not NoneType; e.g. "):
        load_weights_file(model, None)
    with pytest.raises(ArgumentError, match=r"^path='.*': is a folder, not a weights file; give a .safetensors"):
        load_weights_file(model, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^path='.*gone.pth': no such file"):
        load_weights_file(model, tmp_path / "gone.pth")
    with pytest.raises(ArgumentError, match=r"^allow_nonfinite='False': must be True"):
        load_state_dict(model, {}, allow_nonfinite="False")


def test_timm_s_block_i_maps_to_the_i_th_self_attention_block_past_ten():
    """timm's `blocks.10` is the eleventh block, whose Keras name sorts before `..._2` as a string."""
    from keras_cait.models.architecture import build_cait
    from keras_cait.weights.convert import timm_key_map

    model = build_cait(embed_dim=16, depth=12, num_heads=2, init_values=0.1, input_shape=(16, 16, 3), classes=3)
    mapped = {key: variable.path for key, variable, _ in timm_key_map(model)}
    for i in range(12):
        assert mapped[f"blocks.{i}.attn.qkv.weight"].startswith(f"self_attention_block_{i}/"), (i, mapped)


def test_the_loaders_name_a_checkpoint_a_path_or_a_model_they_cannot_take(tmp_path, tiny_cait):
    from keras_cait.weights import load_imagenet_weights, load_state_dict

    model = tiny_cait()
    with pytest.raises(ValueError, match=r"^arch='cait_xxs24': no such CaiT checkpoint; the released ones are "
                                         r"cait_xxs24_224, cait_xxs24_384, "):
        load_imagenet_weights(model, "cait_xxs24")  # was KeyError: 'cait_xxs24'
    path = str(tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"^state_dict='{path}': a path, not a state_dict .*; read it first: "
                                         r"keras_cait.weights.read_checkpoint\("):
        load_state_dict(model, path)  # was: the checkpoint does not fit the model, every key missing
    with pytest.raises(ValueError, match=r"^state_dict=<NoneType>: must be a dict of timm names to arrays"):
        load_state_dict(model, None)
    for call, name in [(lambda: load_imagenet_weights("m.keras", "cait_xxs24_224"), "load_imagenet_weights"),
                       (lambda: load_state_dict("m.keras", {}), "load_state_dict"),
                       (lambda: load_weights_file(path, model), "load_weights_file")]:
        with pytest.raises(ValueError, match=rf"^model=.*: {name} takes a Keras model, not a "):
            call()
