"""Training on several GPUs or hosts: tf.distribute strategies, or Keras' DataParallel on JAX.

    strategy      backend      what it is
    none          any          one device (the default)
    mirrored      tensorflow   tf.distribute.MirroredStrategy: all GPUs of this host
    multiworker   tensorflow   tf.distribute.MultiWorkerMirroredStrategy: several hosts
                               (each started with its TF_CONFIG)
    dataparallel  jax          keras.distribution.DataParallel: all devices of this host,
                               or of several hosts (each started with Keras'
                               KERAS_DISTRIBUTION_* variables)

Keras splits each global batch over the replicas, so the data pipeline batches
with `global batch = per-replica batch × replicas` and the learning rate is
scaled with the global batch (`schedule.scaled_learning_rate`).

Across hosts, every process builds the same stream of global batches and keeps
its own slice of each one: rows [i·B/N, (i+1)·B/N) of every global batch B for
process (worker) i of N. On JAX that is Keras' own sharding
(`keras.distribution.Distribution.distribute_dataset`: rebatch, then shard by
process); on TensorFlow it is tf.distribute's DATA auto-sharding, which this
module asks for explicitly (FILE sharding would give each worker other
examples, and other step counts, than one process training on the same data).
The replicas then train as one process with the global batch would: the same
examples in each step, the gradients averaged over all of them. Process 0 (the
TF_CONFIG chief, else worker 0) writes the run's files. docs/distributed_training.md
shows the commands of a cluster (by hand, SLURM, Kubernetes).
"""

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable

import keras

from keras_cait.errors import ArgumentError, Named

STRATEGIES = ("none", "mirrored", "multiworker", "dataparallel")

# Keras' own variables for JAX across processes (`keras.distribution.initialize`).
ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
JAX_VARIABLES = (ADDRESSES, NUM_PROCESSES, PROCESS_ID)
_EXAMPLE = (f"{ADDRESSES}=host1:12345,host2:12345 {NUM_PROCESSES}=2 {PROCESS_ID}=0 on host1 "
            f"(and {PROCESS_ID}=1 on host2)")


@dataclasses.dataclass(frozen=True)
class Processes:
    """The cluster of KERAS_DISTRIBUTION_* variables: the coordinator's address (process 0's
    host:port), how many processes, and which one this is."""

    coordinator: str
    count: int
    index: int


def _address_problem(address):
    host, colon, port = address.strip().rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{address.strip()!r} is not host:port"
    return None


def jax_processes(environ=None):
    """The `Processes` that Keras' KERAS_DISTRIBUTION_* variables describe, None where none is set.

    All three must be set, or none: `keras.distribution.initialize` would
    otherwise leave the missing ones to JAX's guess of the cluster, and a
    process that finds none trains alone. KERAS_DISTRIBUTION_JOB_ADDRESSES is
    the coordinator's host:port (process 0's) or every process's, comma-separated,
    process 0's first. A ValueError names the variable and what it allows.
    """
    environ = os.environ if environ is None else environ
    given = {name: environ[name].strip() for name in JAX_VARIABLES if environ.get(name, "").strip()}
    if not given:
        return None
    missing = [name for name in JAX_VARIABLES if name not in given]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not set while {', '.join(given)} {'is' if len(given) == 1 else 'are'}; "
            f"set all three or none, e.g. {_EXAMPLE}."
        )
    count, index = given[NUM_PROCESSES], given[PROCESS_ID]
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{NUM_PROCESSES}={count}: must be the number of processes, a whole number "
                         f"of at least 1, e.g. {NUM_PROCESSES}=2.")
    count = int(count)
    if not index.isdigit() or int(index) >= count:
        raise ValueError(f"{PROCESS_ID}={index}: must be this process's index, 0 to {count - 1} "
                         f"({NUM_PROCESSES}={count}); 0 on the coordinator's host.")
    addresses = given[ADDRESSES].split(",")
    problems = [problem for problem in map(_address_problem, addresses) if problem]
    if problems or len(addresses) not in (1, count):
        why = problems[0] if problems else f"{len(addresses)} addresses for {count} processes"
        raise ValueError(
            f"{ADDRESSES}={given[ADDRESSES]}: {why}; give the coordinator's host:port (process 0's), "
            f"or all {count} processes' host:port comma-separated, process 0's first."
        )
    return Processes(addresses[0].strip(), count, int(index))


def _cluster_size(tf_config):
    cluster = json.loads(tf_config).get("cluster", {})
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def _check_no_cluster_for(name, environ=None):
    """Refuses a cluster of processes that strategy `name` would not join: each would train alone."""
    environ = os.environ if environ is None else environ
    count = environ.get(NUM_PROCESSES, "").strip()
    if name != "dataparallel" and count.isdigit() and int(count) > 1:
        raise ArgumentError(
            "strategy", name, [f"{NUM_PROCESSES}={count} makes a cluster of JAX processes, which only ",
                               Named("strategy", "dataparallel"), " (KERAS_BACKEND=jax) joins: each process would "
                               "train alone"],
            ["use ", Named("strategy", "dataparallel"), ", or unset the KERAS_DISTRIBUTION_* variables"])
    tf_config = environ.get("TF_CONFIG", "")
    if name not in ("multiworker", "dataparallel") and tf_config.strip():
        try:
            size = _cluster_size(tf_config)
        except (ValueError, AttributeError, TypeError):
            size = 0  # not ours to judge: a multiworker run reports it
        if size > 1:
            raise ArgumentError(
                "strategy", name, [f"TF_CONFIG names a cluster of {size} workers, which only ",
                                   Named("strategy", "multiworker"), " joins: each process would train alone"],
                ["use ", Named("strategy", "multiworker"), ", or unset TF_CONFIG"])


def _start_jax_processes(processes):
    """Joins the JAX processes of `processes` (Keras' `keras.distribution.initialize`)."""
    import jax

    if processes.count == 1:
        return
    # CPU devices talk through gloo (GPUs through NCCL, JAX's choice there); JAX
    # reads JAX_CPU_COLLECTIVES_IMPLEMENTATION itself, which wins when set.
    if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize(processes.coordinator, processes.count, processes.index)
    if jax.process_count() != processes.count:
        raise ValueError(
            f"{NUM_PROCESSES}={processes.count} but JAX joined {jax.process_count()} process(es); "
            f"check that every process has the same {ADDRESSES}."
        )


def _data_parallel(devices=None):
    """keras.distribution.DataParallel over every device of every process, which gives each
    evaluation batch the full global size, so that Keras can split it evenly.

    Keras' sharding needs every batch to split evenly over the processes (and each
    process's rows over its devices); an evaluation set's last batch seldom does,
    and a process with one batch less than the others would wait for them
    forever. That batch is filled up to the global size with rows of sample weight
    0, which the (weighted) metrics and the loss (`mean_with_sample_weight`)
    leave out; `val_loss` still weighs that batch by its full size.
    """

    class DataParallel(keras.distribution.DataParallel):
        def distribute_dataset(self, dataset):
            if self.num_model_replicas > 1:
                dataset = _full_batches(dataset)
            distributed = super().distribute_dataset(dataset)
            batches = int(dataset.cardinality())
            if distributed is not dataset and batches >= 0:
                # One slice of each global batch: as many batches as before, which
                # rebatch() leaves unknown (and Keras warns at the end of the first pass).
                import tensorflow as tf

                distributed = distributed.apply(tf.data.experimental.assert_cardinality(batches))
            return distributed

    return DataParallel(devices=devices or keras.distribution.list_devices())


def _full_batches(dataset):
    """`dataset`'s batches of (x, y[, sample weight]), a partial batch filled up with weight-0 rows;
    a dataset whose batches all have one static size is returned as it is."""
    import tensorflow as tf

    if all(spec.shape.rank and spec.shape[0] is not None for spec in tf.nest.flatten(dataset.element_spec)):
        return dataset
    first = next(iter(dataset.take(1)), None)  # the batch size: every batch but the last has it
    if first is None:
        return dataset  # Keras names the problem
    size = int(tf.nest.flatten(first)[0].shape[0])

    def fill(*element):
        x, y = element[0], element[1]
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        missing = size - rows

        def padded(tensor):
            tensor = tf.pad(tensor, [[0, missing]] + [[0, 0]] * (tensor.shape.rank - 1))
            return tf.ensure_shape(tensor, [size] + tensor.shape[1:].as_list())

        weight = tf.concat([tf.ones([rows]), tf.zeros([missing])], 0)
        if len(element) > 2:
            weight = weight * tf.cast(padded(element[2]), weight.dtype)
        return tf.nest.map_structure(padded, x), tf.nest.map_structure(padded, y), tf.ensure_shape(weight, [size])

    return dataset.map(fill)


def _multi_worker_strategy():
    import tensorflow as tf

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        """Works around keras-team/keras#20585: Keras 3's `fit` reduces nests of
        per-replica values, and scalars with `axis=0`, which this strategy's
        `reduce` rejects; reduce each leaf, over replicas only for scalars."""

        def reduce(self, reduce_op, value, axis):
            def leaf(v):
                sample = v.values[0] if isinstance(v, tf.distribute.DistributedValues) else v
                return super(MultiWorkerMirroredStrategy, self).reduce(
                    reduce_op, v, axis if sample.shape.rank else None
                )

            return tf.nest.map_structure(leaf, value)

        def experimental_distribute_dataset(self, dataset, options=None):
            """Each worker's slice of every global batch (DATA auto-sharding), whatever the
            dataset reads from: FILE sharding, tf.distribute's AUTO choice for a
            dataset of files, would give each worker other files."""
            data = tf.data.Options()
            data.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
            return super().experimental_distribute_dataset(dataset.with_options(data), options)

    return MultiWorkerMirroredStrategy()


@dataclasses.dataclass
class Distribution:
    """Where a run trains.

    Attributes:
        name: one of `STRATEGIES`.
        replicas: devices that each take a share of every batch (all workers).
        is_chief: whether this process writes the run's outputs (the "chief"
            task of TF_CONFIG, else worker 0; JAX's process 0).
        worker_index: this process's index among the workers (0 alone); on JAX
            across hosts, the KERAS_DISTRIBUTION_PROCESS_ID.
        scope: makes a context manager to build and compile the model in.
    """

    name: str
    replicas: int
    is_chief: bool
    worker_index: int
    scope: Callable[[], contextlib.AbstractContextManager]

    def global_batch_size(self, per_replica_batch_size):
        return per_replica_batch_size * self.replicas


def distribution(name="none"):
    """Sets up the strategy `name` (see the module docstring) and returns its `Distribution`."""
    backend = keras.backend.backend()
    if name not in STRATEGIES:
        raise ArgumentError("strategy", name, f"must be one of {', '.join(STRATEGIES)}", usage=True)
    needs = {"mirrored": "tensorflow", "multiworker": "tensorflow", "dataparallel": "jax"}
    if name in needs and backend != needs[name]:
        others = [Named("strategy", "dataparallel")] if backend == "jax" else [
            Named("strategy", "mirrored"), " or ", Named("strategy", "multiworker")]
        raise ArgumentError("strategy", name, f"needs the {needs[name]} backend but Keras runs on {backend}",
                            [f"set KERAS_BACKEND={needs[name]} or use ", *others])
    _check_no_cluster_for(name)
    if name == "none":
        return Distribution(name, 1, True, 0, contextlib.nullcontext)
    if name == "dataparallel":
        processes = jax_processes()
        if processes is not None:
            _start_jax_processes(processes)
        data_parallel = _data_parallel()
        keras.distribution.set_distribution(data_parallel)
        index = processes.index if processes is not None else 0
        return Distribution(name, data_parallel.num_model_replicas, index == 0, index,
                            contextlib.nullcontext)

    import tensorflow as tf

    if name == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
        return Distribution(name, strategy.num_replicas_in_sync, True, 0, strategy.scope)
    if "TF_CONFIG" not in os.environ:
        raise ArgumentError(
            "strategy", name, "needs the TF_CONFIG environment variable on each host",
            'e.g. {"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}')
    config = json.loads(os.environ["TF_CONFIG"])
    task_type = config.get("task", {}).get("type", "worker")
    index = int(config.get("task", {}).get("index", 0))
    # The chief is the "chief" task if the cluster has one, else worker 0.
    has_chief = "chief" in config.get("cluster", {})
    is_chief = task_type == "chief" or (not has_chief and index == 0)
    strategy = _multi_worker_strategy()
    return Distribution(name, strategy.num_replicas_in_sync, is_chief, index, strategy.scope)
