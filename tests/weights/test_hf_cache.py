"""weights="imagenet" through the Hugging Face cache, the one timm fills.

A fake hub on 127.0.0.1 (HF_ENDPOINT) answers as huggingface.co does
(tests/weights/fake_hf_hub.py); one test runs a fresh process, where huggingface_hub reads
the HF_* variables itself.
"""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_cait
from keras_cait.weights import CHECKPOINTS, WEIGHT_FILES, hf_cache
from keras_cait.weights.registry import HUB_URL_ENV, TAG
from tests.weights.fake_hf_hub import (  # noqa: F401  (hf, hub: fixtures)
    COMMIT, HF_VARIABLES, UNREACHABLE, FakeHub, hf, hub, load_in_a_fresh_process, sha256,
    unreachable_url,
)


def logits(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


def listing(folder):
    """Every file and link under `folder`, relative, with where each link points."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                found[os.path.relpath(path, folder)] = os.readlink(path)
            elif os.path.isfile(path):
                found[os.path.relpath(path, folder)] = "file"
    return found


@pytest.mark.large
def test_imagenet_downloads_into_the_hugging_face_cache_verified_by_the_blob_name(
    hf, hub, keras_cache, timm_reference, timm_checkpoint, monkeypatch
):
    monkeypatch.setitem(CHECKPOINTS["cait_xxs24_224"], "sha256", None)  # verified by the hub's hash
    reference, body = timm_checkpoint("cait_xxs24_224")
    hub.serve("cait_xxs24_224", body)
    hf.set(HF_TOKEN="hf_secret")
    images = timm_reference.images(2, 224)
    expected, _ = timm_reference.outputs(reference, images)

    model = keras_cait.CaiT_XXS24(weights="imagenet", classifier_activation=None)

    timm_reference.assert_matches(logits(model, images), expected, "logits")
    path = FakeHub.path("cait_xxs24_224")
    assert hub.requests == [
        ("HEAD", path, "Bearer hf_secret"),  # HF_TOKEN, to the hub only
        ("GET", FakeHub.cdn_path(path), None),
    ]
    assert listing(hf.repo("cait_xxs24_224")) == {  # huggingface_hub's layout, as timm leaves it
        f"blobs/{sha256(body)}": "file",
        "refs/main": "file",
        f"snapshots/{COMMIT}/model.safetensors": f"../../blobs/{sha256(body)}",
    }
    assert not os.path.exists(keras_cache), "nothing is written beside the Hugging Face cache"


@pytest.mark.large
@pytest.mark.parametrize("where", ["in_transit", "on_disk"])
def test_a_blob_whose_bytes_differ_from_its_name_is_refused_removed_and_nothing_cached(
    hf, hub, keras_cache, timm_reference, timm_checkpoint, where
):
    _, body = timm_checkpoint("cait_xxs24_384")
    altered = bytearray(body)
    altered[len(body) // 3] ^= 0x01  # same size, still a valid safetensors file
    blob = hf.repo("cait_xxs24_384") / "blobs" / sha256(body)
    if where == "in_transit":
        hub.serve("cait_xxs24_384", body, cdn_body=bytes(altered))
    else:  # downloaded intact (by timm, say), then changed in the cache
        hub.serve("cait_xxs24_384", body)
        import huggingface_hub

        huggingface_hub.hf_hub_download(f"timm/cait_xxs24_384.{TAG}", "model.safetensors")
        blob.write_bytes(altered)

    with pytest.raises(OSError, match="corrupted ImageNet weights of cait_xxs24_384") as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    message = str(error.value)
    assert f"is {sha256(bytes(altered))}, not the {sha256(body)} it is named after" in message
    assert "It was removed from the cache" in message
    assert not any(name.endswith("model.safetensors") or "blobs/" in name
                   for name in listing(hf.repo("cait_xxs24_384"))), "the blob and its link are gone"
    assert not os.path.exists(keras_cache) or os.listdir(keras_cache) == []


@pytest.mark.large
def test_the_pinned_sha256_wins_over_the_blob_name(hf, hub, keras_cache, timm_checkpoint):
    """cait_xxs24_224's real hash is pinned: an intact hub file with another hash is refused
    (and left to timm: its bytes match its name)."""
    _, body = timm_checkpoint("cait_xxs24_224")
    hub.serve("cait_xxs24_224", body)

    with pytest.raises(OSError, match="not the ones keras_cait expects") as error:
        keras_cait.CaiT_XXS24(weights="imagenet")

    assert f"the pinned sha256 is {CHECKPOINTS['cait_xxs24_224']['sha256']}" in str(error.value)
    assert (hf.repo("cait_xxs24_224") / "blobs" / sha256(body)).exists()
    assert not os.path.exists(keras_cache) or os.listdir(keras_cache) == []


def no_probe(monkeypatch):
    monkeypatch.setattr(hf_cache, "unreachable", lambda url: pytest.fail(f"probed {url}"))


@pytest.mark.large
def test_offline_with_nothing_cached_names_the_cache_and_sends_no_request(
    hf, hub, keras_cache, monkeypatch
):
    hf.set(HF_HUB_OFFLINE="1")
    no_probe(monkeypatch)

    with pytest.raises(ConnectionError, match="not in the Hugging Face cache") as error:
        keras_cait.CaiT_XXS24(weights="imagenet")

    assert "HF_HUB_OFFLINE is set" in str(error.value)
    assert str(hf.cache) in str(error.value)
    assert hub.requests == []
    # One traceback: huggingface_hub's own error kept as `cause`, not chained
    assert error.value.__cause__ is None and error.value.__suppress_context__ and error.value.cause is not None
    assert not os.path.exists(keras_cache) or os.listdir(keras_cache) == []


@pytest.mark.parametrize("route", ["huggingface_hub", "keras_cait_hub_url"])
def test_without_network_the_error_names_random_weights_with_the_scratch_recipe_a_file_and_the_cache(
    hf, keras_cache, monkeypatch, route
):
    """What a Python caller reads offline: weights=None with the recipe that learns from random
    weights, a checkpoint file of each kind weights= reads, and where the cache is."""
    from keras_cait.training.recipe import RECIPES

    with unreachable_url("refused") as url:
        if route == "huggingface_hub":
            hf.set(HF_ENDPOINT=url)
        else:
            monkeypatch.setenv(HUB_URL_ENV, url)
        with pytest.raises(ConnectionError) as error:
            keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(32, 32, 3))

    message = str(error.value)
    assert "\n" not in message, message
    assert "weights=None trains from random weights" in message, message
    recipe = re.search(r"RECIPES\['([\w-]+)'\]", message).group(1)
    assert RECIPES[recipe] is RECIPES["scratch"], message
    assert "weights='/path/to/model.safetensors'" in message
    assert all(kind in message for kind in WEIGHT_FILES), message
    assert str(hf.cache if route == "huggingface_hub" else keras_cache) in message


@pytest.mark.large
@pytest.mark.parametrize("route", ["without_huggingface_hub", "keras_cait_hub_url"])
def test_the_own_downloader_is_used_without_huggingface_hub_or_with_keras_cait_hub_url(
    hf, hub, keras_cache, timm_reference, timm_checkpoint, route
):
    from keras_cait.weights import registry

    _, body = timm_checkpoint("cait_xxs24_384")
    hub.serve("cait_xxs24_384", body)
    with pytest.MonkeyPatch.context() as patch:  # undone before `hf` reloads huggingface_hub's settings
        if route == "without_huggingface_hub":
            patch.setitem(sys.modules, "huggingface_hub", None)
            patch.setattr(registry, "HUB_URL", hub.url + "/timm")  # stands for huggingface.co/timm
        else:
            patch.setenv(HUB_URL_ENV, hub.url + "/timm")

        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    path = FakeHub.path("cait_xxs24_384")
    assert hub.requests == [("GET", path, None), ("GET", FakeHub.cdn_path(path), None)]
    assert not hf.cache.exists()
    assert sorted(os.listdir(keras_cache)) == [f".cait_xxs24_384.{TAG}.safetensors.sha256", f"cait_xxs24_384.{TAG}.safetensors"]


@pytest.mark.large
def test_a_file_timm_downloaded_loads_in_a_fresh_offline_process(
    hf, hub, tmp_path, timm_reference, timm_checkpoint
):
    """timm fills the cache through the fake hub; the hub goes away; a new process with
    HF_HUB_OFFLINE=1 builds the model from that file and computes timm's logits."""
    import timm

    _, body = timm_checkpoint("cait_xxs24_384")
    hub.serve("cait_xxs24_384", body)
    downloaded_by_timm = timm.create_model("cait_xxs24_384", pretrained=True).eval()
    hub.close()
    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(downloaded_by_timm, images)
    np.save(tmp_path / "images.npy", images)
    env = {name: value for name, value in os.environ.items() if name not in HF_VARIABLES}
    env.update(HF_HOME=str(hf.home), HF_HUB_OFFLINE="1", HF_ENDPOINT=hub.url,
               KERAS_HOME=str(tmp_path / "fresh_keras_home"), TF_CPP_MIN_LOG_LEVEL="3")
    script = (
        "import sys, numpy as np, keras_cait\n"
        "model = keras_cait.CaiT_XXS24(weights='imagenet', input_shape=(384, 384, 3), "
        "classifier_activation=None)\n"
        "np.save(sys.argv[1] + '/logits.npy', np.asarray(model(np.load(sys.argv[1] + '/images.npy'))))\n"
    )

    subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, check=True, timeout=300)

    timm_reference.assert_matches(np.load(tmp_path / "logits.npy"), expected, "logits")
    assert len([request for request in hub.requests if request[0] == "GET"]) == 1, "timm's download only"


@pytest.mark.large
@pytest.mark.parametrize("offline", [False, True], ids=["online", "offline"])
def test_a_cache_without_symlinks_is_verified_by_the_hubs_hash_or_refused_offline(
    hf, hub, keras_cache, timm_reference, timm_checkpoint, offline
):
    """huggingface_hub without symlinks (Windows without developer mode) keeps the file under
    the snapshot's name, no blob named by its sha256: the hash is asked from the hub."""
    _, body = timm_checkpoint("cait_xxs24_384")
    hub.serve("cait_xxs24_384", body)
    repo = hf.repo("cait_xxs24_384")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    altered = bytearray(body)
    altered[len(body) // 3] ^= 0x01
    (repo / "snapshots" / COMMIT / "model.safetensors").write_bytes(bytes(altered))
    if offline:
        hf.set(HF_HUB_OFFLINE="1")

    with pytest.raises(OSError) as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    if offline:
        assert "Cannot verify the ImageNet weights of cait_xxs24_384" in str(error.value)
        assert hub.requests == []
    else:
        assert f"the sha256 the hub sent (X-Linked-Etag) is {sha256(body)}" in str(error.value)
        assert [method for method, _, _ in hub.requests] == ["HEAD", "HEAD"], "no download"
    assert not os.path.exists(keras_cache) or os.listdir(keras_cache) == []


@pytest.mark.large
@pytest.mark.parametrize("kind", UNREACHABLE)
def test_an_unreachable_hub_fails_at_once_after_one_connection_attempt(tmp_path, kind):
    """Nothing cached, no network: one connect tells, where huggingface_hub retried five times
    (25 s when the name does not resolve or the connection is refused; 400 s when the host drops
    packets)."""
    with unreachable_url(kind) as url:
        outcome = load_in_a_fresh_process(url, str(tmp_path), HF_ENDPOINT=url)

    host = url.removeprefix("http://")
    assert outcome["attempts"] == 1, outcome
    assert outcome["seconds"] < 10 + (hf_cache.PROBE_SECONDS if kind == "silent" else 0), outcome
    assert outcome["connection_error"], outcome
    assert outcome["message"].startswith(
        "The ImageNet weights of cait_xxs24_224 are not in the Hugging Face cache"
    ), outcome
    assert f"{url}/timm/cait_xxs24_224.{TAG} is unreachable" in outcome["message"]
    assert host in outcome["message"].split(" is unreachable: ")[1]
    assert "HF_HUB_OFFLINE=1" in outcome["message"]
    assert "weights='/path/to/model.safetensors'" in outcome["message"]


@pytest.mark.large
def test_a_cached_file_loads_without_network_and_without_a_probe(
    hf, hub, keras_cache, timm_reference, timm_checkpoint, monkeypatch
):
    """HF_HUB_OFFLINE not set, the hub gone: huggingface_hub's one failed request (no retry)
    falls back to the cached file; keras_cait does not probe."""
    import huggingface_hub

    reference, body = timm_checkpoint("cait_xxs24_384")
    hub.serve("cait_xxs24_384", body)
    huggingface_hub.hf_hub_download(f"timm/cait_xxs24_384.{TAG}", "model.safetensors")
    hub.close()
    no_probe(monkeypatch)

    model = keras_cait.CaiT_XXS24(
        weights="imagenet", input_shape=(384, 384, 3), classifier_activation=None
    )

    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(reference, images)
    timm_reference.assert_matches(logits(model, images), expected, "logits")
    assert len([request for request in hub.requests if request[0] == "GET"]) == 1, "the first download only"


def test_the_probe_goes_to_the_proxy_that_carries_the_request(monkeypatch):
    """Behind a proxy the hub's own address may be unreachable while the download works."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert hf_cache.first_hop("https://huggingface.co") == ("huggingface.co", 443, False)
    assert hf_cache.first_hop("http://127.0.0.1:8080/hf") == ("127.0.0.1", 8080, False)

    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    assert hf_cache.first_hop("https://huggingface.co") == ("proxy.example", 3128, True)
    assert hf_cache.first_hop("http://mirror.example") == ("mirror.example", 80, False)

    monkeypatch.setenv("no_proxy", "huggingface.co")
    assert hf_cache.first_hop("https://huggingface.co") == ("huggingface.co", 443, False)


@pytest.mark.parametrize("pinned", [False, True])
def test_verify_refuses_and_removes_a_blob_whose_bytes_differ_from_its_name(tmp_path, monkeypatch, pinned):
    """The quick form of the large test above: the cache's layout made by hand, no hub, no model."""
    arch = "cait_xxs24_384"
    body = os.urandom(4096)
    monkeypatch.setitem(CHECKPOINTS[arch], "sha256", sha256(body) if pinned else None)
    altered = bytearray(body)
    altered[len(body) // 3] ^= 0x01
    blob = tmp_path / "blobs" / sha256(body)
    snapshot = tmp_path / "snapshots" / COMMIT / hf_cache.FILENAME
    blob.parent.mkdir(parents=True)
    snapshot.parent.mkdir(parents=True)
    blob.write_bytes(bytes(altered))
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))

    with pytest.raises(OSError, match=f"corrupted ImageNet weights of {arch}") as error:
        hf_cache.verify(None, arch, str(snapshot))

    assert f"is {sha256(bytes(altered))}, not the {sha256(body)} it is named after" in str(error.value)
    assert not blob.exists() and not os.path.lexists(snapshot), "the blob and its link are removed"


def test_verify_accepts_a_blob_whose_bytes_match_its_name(tmp_path, monkeypatch):
    arch = "cait_xxs24_384"
    body = os.urandom(4096)
    monkeypatch.setitem(CHECKPOINTS[arch], "sha256", None)
    blob = tmp_path / "blobs" / sha256(body)
    snapshot = tmp_path / "snapshots" / COMMIT / hf_cache.FILENAME
    blob.parent.mkdir(parents=True)
    snapshot.parent.mkdir(parents=True)
    blob.write_bytes(body)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))

    hf_cache.verify(None, arch, str(snapshot))

    assert blob.read_bytes() == body and os.path.lexists(snapshot)
