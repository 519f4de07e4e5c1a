"""Downloads that stay bounded, a cache that heals, and one download per cache entry.

The hub is tests/weights/test_weights.py's loopback server; its `responders` answer as a
hostile or broken server would. Every server loop is bounded, so a download that
fails to stop ends the test with a wrong byte count rather than hanging it.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest

import keras_cait
from keras_cait.weights import DownloadError, download, hf_cache
from keras_cait.weights.registry import HUB_URL_ENV, TAG
from tests.weights.fake_hf_hub import UNREACHABLE, load_in_a_fresh_process, unreachable_url
from tests.weights.test_weights import Hub, cached_files, hub, hub_headers, logits  # noqa: F401  (hub: the fixture)

ARCH = "cait_xxs24_384"
A_HASH = {"X-Linked-Etag": f'"{"ab" * 32}"'}
ADVICE = "weights='/path/to/model.safetensors'"


def endless(handler):
    """A body with no declared end: 64 MiB of zeros, then the connection closes."""
    handler.send_response(200)
    handler.end_headers()
    block = bytes(1 << 16)
    with contextlib.suppress(OSError):
        for _ in range(1024):
            handler.wfile.write(block)


def via_cdn(hub, responder, hub_headers):
    """The hub's 302 with `hub_headers`, to a CDN path answered by `responder`."""
    hub.redirects[Hub.path(ARCH)] = (hub.url + "/cdn/body", hub_headers)
    hub.responders["/cdn/body"] = responder


def written(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


def test_a_body_longer_than_the_hubs_x_linked_size_stops_within_a_byte_of_it(hub, tmp_path):
    via_cdn(hub, endless, {**A_HASH, "X-Linked-Size": "100"})
    destination = str(tmp_path / "model.safetensors")

    with pytest.raises(DownloadError, match="sent more than the 100 bytes it declared") as error:
        download.download(ARCH, destination, max_bytes=10**9)

    assert written(destination) <= 101
    assert hub.url in str(error.value) and ADVICE in str(error.value)


def test_a_body_of_no_declared_size_stops_at_the_bound(hub, tmp_path):
    via_cdn(hub, endless, A_HASH)
    destination = str(tmp_path / "model.safetensors")

    with pytest.raises(DownloadError, match="more than the 5000 bytes the weights of cait_xxs24_384"):
        download.download(ARCH, destination, max_bytes=5000)

    assert written(destination) <= 5001


def test_a_declared_size_above_the_bound_is_refused_before_writing(hub, tmp_path):
    via_cdn(hub, endless, {**A_HASH, "X-Linked-Size": str(10**12)})
    destination = str(tmp_path / "model.safetensors")

    with pytest.raises(DownloadError, match=f"declares {10**12} bytes .* more than the 5000"):
        download.download(ARCH, destination, max_bytes=5000)

    assert not os.path.exists(destination)


def test_the_bound_of_imagenet_weights_is_the_checkpoints_size_plus_one_percent(
    hub, keras_cache, timm_reference
):
    checkpoint = os.path.getsize(timm_reference.save(timm_reference.model(ARCH)))
    via_cdn(hub, endless, A_HASH)  # no X-Linked-Size, no Content-Length

    with pytest.raises(DownloadError, match="more than the") as error:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))

    bound = int(re.search(r"more than the (\d+) bytes", str(error.value))[1])
    assert checkpoint <= bound <= checkpoint * 1.011
    assert cached_files(keras_cache) == []


def redirect_to(location):
    def respond(handler):
        handler.send_response(302)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return respond


@pytest.mark.parametrize("location", [
    "file://localhost/dev/zero",  # another "host": taken as the CDN
    "file:///etc/hostname",  # no host: taken as a redirect within the hub
    "ftp://127.0.0.1/model.safetensors",
])
def test_redirects_go_to_http_or_https_only(hub, tmp_path, location):
    hub.responders[Hub.path(ARCH)] = redirect_to(location)
    destination = str(tmp_path / "model.safetensors")

    with pytest.raises(DownloadError, match="only http and https URLs are opened") as error:
        download.download(ARCH, destination, max_bytes=10**9)

    assert location in str(error.value)
    assert not os.path.exists(destination)


def test_a_cdn_redirecting_to_a_file_is_refused(hub, tmp_path):
    via_cdn(hub, redirect_to("file://localhost/dev/zero"), A_HASH)
    destination = str(tmp_path / "model.safetensors")

    with pytest.raises(DownloadError, match="a redirect from .*/cdn/body"):
        download.download(ARCH, destination, max_bytes=10**9)

    assert not os.path.exists(destination)


def test_a_hub_url_that_is_not_http_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(HUB_URL_ENV, "file:///dev")

    with pytest.raises(DownloadError, match=f"only http and https .* {HUB_URL_ENV}"):
        download.download(ARCH, str(tmp_path / "model.safetensors"), max_bytes=10**9)


def cut_off_chunked(handler):
    handler.send_response(200)
    handler.send_header("X-Linked-Etag", A_HASH["X-Linked-Etag"])
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.write(b"10\r\n" + bytes(16) + b"\r\n" + b"400\r\n" + bytes(10))


def silent_after_headers(stop):
    def respond(handler):
        handler.send_response(200)
        handler.send_header("X-Linked-Etag", A_HASH["X-Linked-Etag"])
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.flush()
        stop.wait(30)

    return respond


def test_network_failures_are_one_error_type_naming_the_url_and_the_fix(hub, tmp_path, monkeypatch):
    """A chunked body cut off mid-stream, a server silent after its headers, no server."""
    stop = threading.Event()
    monkeypatch.setattr(download, "TIMEOUT_SECONDS", 0.5)
    closed = Hub()
    closed.close()
    cases = {
        "IncompleteRead": (hub.url, cut_off_chunked),
        "timed out": (hub.url, silent_after_headers(stop)),
        "Connection refused": (closed.url, cut_off_chunked),  # never reached
    }
    try:
        for reason, (server, responder) in cases.items():
            monkeypatch.setenv(HUB_URL_ENV, server)
            hub.responders[Hub.path(ARCH)] = responder

            with pytest.raises(DownloadError) as error:
                download.download(ARCH, str(tmp_path / "model.safetensors"), max_bytes=10**9)

            assert isinstance(error.value, OSError)
            message = str(error.value)
            assert reason in message and f"{server}/{ARCH}.{TAG}" in message and ADVICE in message
    finally:
        stop.set()


@pytest.mark.large
@pytest.mark.parametrize("kind", UNREACHABLE)
def test_an_unreachable_mirror_fails_at_once_after_one_connection_attempt(tmp_path, kind):
    """keras_cait's own downloader makes no retries: a name that does not resolve or a refused
    connection fail at once; a host that drops packets within hf_cache.PROBE_SECONDS (urllib
    alone waited TIMEOUT_SECONDS, 60 s)."""
    with unreachable_url(kind) as url:
        outcome = load_in_a_fresh_process(url, str(tmp_path), **{HUB_URL_ENV: url})

    assert outcome["attempts"] == 1, outcome
    assert outcome["seconds"] < 10 + (hf_cache.PROBE_SECONDS if kind == "silent" else 0), outcome
    assert outcome["error"] == "DownloadError", outcome
    assert outcome["message"].startswith(
        f"Could not download the ImageNet weights of cait_xxs24_224 from {url}/cait_xxs24_224.{TAG}"
    ), outcome
    assert ADVICE in outcome["message"]


@pytest.mark.large
@pytest.mark.parametrize("entry", ["another_variant", "a_folder"])
def test_a_cache_entry_that_does_not_fit_is_downloaded_again(hub, keras_cache, timm_reference, entry):
    reference = timm_reference.model(ARCH)
    body = timm_reference.save(reference).read_bytes()
    hub.serve_via_cdn(ARCH, body, hub_headers(body))
    cached = os.path.join(keras_cache, f"{ARCH}.{TAG}.safetensors")
    os.makedirs(keras_cache)
    if entry == "another_variant":
        shutil.copy(timm_reference.save(timm_reference.tiny_model(), "tiny.safetensors"), cached)
    else:
        os.makedirs(os.path.join(cached, "inside"))

    with pytest.warns(UserWarning, match=f"{cached} (do not fit|are not a file)"):
        model = keras_cait.CaiT_XXS24(
            weights="imagenet", input_shape=(384, 384, 3), classifier_activation=None
        )

    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(reference, images)
    timm_reference.assert_matches(logits(model, images), expected, "logits")
    assert cached_files(keras_cache) == [f"{ARCH}.{TAG}.safetensors"]


@pytest.mark.large
@pytest.mark.parametrize("case", ["recorded", "pinned, no record", "pinned, the record forged too",
                                  "recorded on the first load after"])
def test_a_cache_entry_changed_since_it_was_verified_is_downloaded_again(hub, keras_cache, timm_reference,
                                                                         monkeypatch, case):
    """Only the header, keys and shapes of a cached file were checked as it loaded: another file of the
    same keys and shapes put there loaded silently. Its sha256 is checked now: the pinned one where there
    is one (a record beside the file does not override it), else the one recorded at its download, or at
    the first load of an entry an earlier keras_cait cached without a record."""
    import hashlib

    from keras_cait.weights.registry import CHECKPOINTS

    reference = timm_reference.model(ARCH)
    body = timm_reference.save(reference).read_bytes()
    if case.startswith("pinned"):
        monkeypatch.setitem(CHECKPOINTS[ARCH], "sha256", hashlib.sha256(body).hexdigest())
    hub.serve_via_cdn(ARCH, body, hub_headers(body))
    cached = os.path.join(keras_cache, f"{ARCH}.{TAG}.safetensors")
    record = os.path.join(keras_cache, f".{ARCH}.{TAG}.safetensors.sha256")
    keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))
    assert open(record).read().strip() == hashlib.sha256(body).hexdigest()
    if case == "recorded on the first load after":  # an entry of an earlier keras_cait, unpinned: trusted once
        os.remove(record)
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))
        assert open(record).read().strip() == hashlib.sha256(body).hexdigest()
    other = timm_reference.save(timm_reference.model(ARCH, seed=1), "other.safetensors")
    shutil.copy(other, cached)  # same keys and shapes
    if case == "pinned, no record":  # an entry an earlier keras_cait cached, without a record
        os.remove(record)
    elif case == "pinned, the record forged too":
        with open(record, "w") as file:
            file.write(hashlib.sha256(other.read_bytes()).hexdigest() + "\n")

    with pytest.warns(UserWarning, match=f"{cached} have changed since they were verified"):
        model = keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3), classifier_activation=None)

    assert [request for request in hub.requests if not request.startswith("/cdn/")] == [Hub.path(ARCH)] * 2
    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(reference, images)
    timm_reference.assert_matches(logits(model, images), expected, "logits")
    assert open(record).read().strip() == hashlib.sha256(body).hexdigest()


def test_removing_a_cache_entry_removes_its_recorded_sha256(tmp_path):
    entry = tmp_path / f"{ARCH}.{TAG}.safetensors"
    entry.write_bytes(b"x")
    (tmp_path / f".{entry.name}.sha256").write_text("ab" * 32 + "\n")
    download.remove_entry(str(entry))
    assert os.listdir(tmp_path) == []


def test_a_read_only_cache_names_keras_home(keras_cache, monkeypatch):
    """keras_cait's own cache (no huggingface_hub, or KERAS_CAIT_HUB_URL set)."""
    monkeypatch.setenv(HUB_URL_ENV, "http://127.0.0.1:9")
    os.makedirs(keras_cache)
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a non-root user would see

    with pytest.raises(PermissionError, match=f"{keras_cache} is not writable.*Set KERAS_HOME"):
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))


def test_a_keras_home_that_is_a_file_is_named(tmp_path, monkeypatch):
    # Before: NotADirectoryError: [Errno 20] Not a directory: '<file>/models', naming neither the cache
    # nor KERAS_HOME.
    home = tmp_path / "keras_home"
    home.write_text("")
    monkeypatch.setenv("KERAS_HOME", str(home))
    monkeypatch.setenv(HUB_URL_ENV, "http://127.0.0.1:9")

    with pytest.raises(NotADirectoryError) as caught:
        keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))
    assert str(caught.value).startswith(
        f"[Errno 20] The weights cache {home}/models/keras_cait cannot be made: {home}/models or a folder above it "
        f"is a file, not a folder (KERAS_HOME={str(home)!r}). Set KERAS_HOME to a folder, or pass a local file: "
        "weights='/path/to/model.safetensors'")


# ---- Several processes: one download per cache entry, and killed fillers ----

FILL_CACHE = f"""
import keras_cait
model = keras_cait.CaiT_XXS24(weights="imagenet", input_shape=(384, 384, 3))
print("loaded", float(sum(abs(w.numpy()).sum() for w in model.weights)))
"""


def gated(body):
    """A CDN that holds the body until `release` is set; `started` is set on each request."""
    started, release = threading.Event(), threading.Event()

    def respond(handler):
        started.set()
        release.wait(300)
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        with contextlib.suppress(OSError):
            handler.wfile.write(body)

    return respond, started, release


def filler(hub, keras_cache, **popen):
    environment = {**os.environ, HUB_URL_ENV: hub.url, "TF_CPP_MIN_LOG_LEVEL": "3",
                   "KERAS_HOME": os.path.dirname(os.path.dirname(keras_cache))}
    return subprocess.Popen([sys.executable, "-c", FILL_CACHE], env=environment, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def wait_for_line(stream, text, seconds):
    """Reads `stream` until a line holding `text` (True) or `seconds` pass (False)."""
    found = threading.Event()

    def read():
        for line in stream:
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(seconds)


def lock_is_free(keras_cache):
    import fcntl

    path = os.path.join(keras_cache, f".{ARCH}.{TAG}.safetensors.lock")
    if not os.path.exists(path):
        return True
    with open(path) as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


@pytest.mark.large
def test_two_processes_filling_one_cache_download_once(hub, keras_cache, timm_reference):
    body = timm_reference.save(timm_reference.model(ARCH)).read_bytes()
    respond, started, release = gated(body)
    via_cdn(hub, respond, hub_headers(body))
    first = filler(hub, keras_cache)
    try:
        assert started.wait(300), "the first process never reached the CDN"
        second = filler(hub, keras_cache)
        try:
            assert wait_for_line(second.stderr, "Waiting for another process", 300)
            release.set()
            outputs = [process.communicate(timeout=300) for process in (first, second)]
        finally:
            second.kill()
    finally:
        release.set()
        first.kill()

    assert [process.returncode for process in (first, second)] == [0, 0], outputs
    assert hub.requests.count("/cdn/body") == 1, "the second process must use the first's download"
    loaded = [stdout.splitlines()[-1] for stdout, _ in outputs]  # after the first's progress bar
    assert loaded[0].startswith("loaded ") and loaded[0] == loaded[1]
    assert cached_files(keras_cache) == [f"{ARCH}.{TAG}.safetensors"]


@pytest.mark.large
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_a_cache_filler_stopped_mid_download_blocks_no_one_and_leaves_nothing_used(
    hub, keras_cache, timm_reference, signal_number
):
    reference = timm_reference.model(ARCH)
    body = timm_reference.save(reference).read_bytes()
    respond, started, release = gated(body)
    via_cdn(hub, respond, hub_headers(body))
    process = filler(hub, keras_cache)
    try:
        assert started.wait(300), "the filler never reached the CDN"
        process.send_signal(signal_number)
        process.communicate(timeout=120)
    finally:
        process.kill()
    left = cached_files(keras_cache)
    if signal_number == signal.SIGINT:  # its own clean-up ran
        assert left == []
    else:  # the half-written download and the lock stay until the next filler
        assert not any(name.endswith(".safetensors") and not name.startswith(".") for name in left)
    release.set()
    assert lock_is_free(keras_cache), "a stopped holder must not keep the lock"

    model = keras_cait.CaiT_XXS24(
        weights="imagenet", input_shape=(384, 384, 3), classifier_activation=None
    )

    images = timm_reference.images(1, 384)
    expected, _ = timm_reference.outputs(reference, images)
    timm_reference.assert_matches(logits(model, images), expected, "logits")
    assert cached_files(keras_cache) == [f"{ARCH}.{TAG}.safetensors"]


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_hub_url_means_the_default_hub(monkeypatch, value):
    """`KERAS_CAIT_HUB_URL= keras-cait ...` (the shell's way to unset it for one command) used to make the URL
    '/cait_...', refused as "not http(s)", and to be taken as unset by the Hugging Face route only."""
    from keras_cait.weights import hf_cache, registry

    monkeypatch.setenv(HUB_URL_ENV, value)
    assert registry.checkpoint_url("cait_xxs24_224") == (
        f"{registry.HUB_URL}/cait_xxs24_224.{TAG}/resolve/main/model.safetensors")
    assert registry.hub_url_override() is None
    monkeypatch.setenv(HUB_URL_ENV, " http://127.0.0.1:9/ ")
    assert registry.checkpoint_url("cait_xxs24_224").startswith("http://127.0.0.1:9/cait_xxs24_224.")
    assert hf_cache.huggingface_hub_or_none() is None  # a mirror set: keras_cait's own downloader
