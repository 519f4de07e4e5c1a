"""benchmarks/harness.py: a pipeline's turn starts it fresh and counts only what it made in the turn."""

import gc
import io
import json
import sys
import time
import weakref

import pytest

from benchmarks import harness


class Pipeline:
    """A pipeline whose batches each take `seconds`; it counts what it made and can be watched for its end."""

    made = []

    def __init__(self, seconds=0.01):
        self.seconds, self.batches = seconds, 0
        Pipeline.made.append(weakref.ref(self))

    def next_batch(self):
        time.sleep(self.seconds)
        self.batches += 1
        return self.batches


@pytest.mark.large
def test_each_turn_times_a_fresh_pipeline_and_drops_it(monkeypatch):
    Pipeline.made = []

    def pipeline():
        # Every earlier pipeline is gone by the time a new one starts: none works ahead.
        gc.collect()
        assert all(ref() is None for ref in Pipeline.made)
        return Pipeline().next_batch

    requests = [{"batch": 4, "seconds": 0.2}, {"batch": 4, "seconds": 0.2}]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(r) + "\n" for r in requests)))
    channel = io.StringIO()
    harness.serve(channel, None, {4: None}, outputs=False, warmups=1, pipeline=pipeline)

    ready, *turns = [json.loads(line) for line in channel.getvalue().splitlines()]
    assert "load_seconds" in ready and "outputs" not in ready
    assert len(Pipeline.made) == 1 + len(requests)  # the warm-up's and one per turn
    for turn in turns:
        # 10 ms a batch: about 100 batches/s, 400 images/s; the untimed first batch is not counted.
        assert turn["calls"] >= 2
        assert 250 < turn["images_per_second"] <= 400, turn


def test_a_turn_does_not_count_its_first_batch():
    def pipeline():
        started = [False]

        def next_batch():
            time.sleep(0.01 if started[0] else 1.0)  # the first batch starts workers, fills buffers
            started[0] = True

        return next_batch

    calls, seconds = harness._pipeline_turn(pipeline, 0.1)
    assert calls >= 2 and seconds < 0.5  # the 1 s first batch is outside the timed span


def test_the_ready_message_carries_what_the_worker_observed_of_its_levers(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    channel, warmed, calls = io.StringIO(), [], []

    def levers():
        calls.append(len(warmed))  # read once the step has run, not before
        return {"largest_xla_fusion": 1}

    harness.serve(channel, warmed.append, {4: 4}, outputs=False, warmups=2, levers=levers)
    (ready,) = [json.loads(line) for line in channel.getvalue().splitlines()]
    assert ready["levers"] == {"largest_xla_fusion": 1} and calls == [2]
