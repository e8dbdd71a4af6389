"""training/fit/arrays: arrays by index, every example once per epoch on any topology, the same global batches on
resume, as properties over examples x batch size x workers x replicas x resume step."""
import numpy as np
from hypothesis import given, settings, strategies as st

from tfgpu.training.fit import arrays


@settings(max_examples=200, deadline=None)
@given(examples=st.integers(1, 300), batch=st.integers(1, 64), workers=st.integers(1, 4),
       local=st.integers(1, 3), seed=st.integers(0, 2**31 - 2), epoch=st.integers(0, 5), shuffle=st.booleans())
def test_every_example_once_per_epoch_split_among_every_replica(examples, batch, workers, local, seed, epoch,
                                                                shuffle):
    order = arrays.epoch_order(examples, epoch, seed, shuffle)
    replicas = workers * local
    steps = arrays.num_steps(examples, batch)
    per_step = {}
    for worker in range(workers):
        ids = range(worker * local, (worker + 1) * local)
        indices, offsets = arrays.worker_parts(order, batch, 0, replicas, ids)
        assert len(offsets) == steps * local + 1  # every replica gets a part of every step, maybe empty
        for j in range(len(offsets) - 1):
            per_step.setdefault(j // local, []).append(indices[offsets[j]:offsets[j + 1]])
    seen = np.concatenate([np.concatenate(parts) for parts in per_step.values()])
    assert sorted(seen.tolist()) == list(range(examples))  # once each, none left out
    for step, parts in per_step.items():  # a step's parts are its global batch, in Keras' order
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.sort(order[step * batch:(step + 1) * batch]))
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=150, deadline=None)
@given(examples=st.integers(1, 200), batch=st.integers(1, 32), before=st.integers(1, 3), after=st.integers(1, 3),
       local=st.integers(1, 2), seed=st.integers(0, 1000), data=st.data())
def test_a_resume_on_another_topology_trains_the_global_batches_the_run_it_continues_would(
        examples, batch, before, after, local, seed, data):
    """Stopped at step k on ``before`` workers and resumed on ``after``: the global batches from step k on are the
    uninterrupted run's, and with the steps before k every example comes once."""
    steps = arrays.num_steps(examples, batch)
    k = data.draw(st.integers(0, steps))
    order = arrays.epoch_order(examples, 3, seed, True)

    def global_batches(workers, first):
        replicas = workers * local
        batches = {}
        for worker in range(workers):
            indices, offsets = arrays.worker_parts(order, batch, first, replicas,
                                                   range(worker * local, (worker + 1) * local))
            for j in range(len(offsets) - 1):
                batches.setdefault(first + j // local, []).extend(indices[offsets[j]:offsets[j + 1]].tolist())
        return {s: sorted(b) for s, b in batches.items()}

    whole = global_batches(before, 0)
    resumed = global_batches(after, k)
    assert resumed == {s: b for s, b in whole.items() if s >= k}
    trained = [i for s in range(k) for i in whole[s]] + [i for b in resumed.values() for i in b]
    assert sorted(trained) == list(range(examples))


def test_orders_differ_by_epoch_and_seed_and_repeat_exactly():
    a = arrays.epoch_order(100, 0, 7, True)
    np.testing.assert_array_equal(a, arrays.epoch_order(100, 0, 7, True))
    assert not np.array_equal(a, arrays.epoch_order(100, 1, 7, True))
    assert not np.array_equal(a, arrays.epoch_order(100, 0, 8, True))
    np.testing.assert_array_equal(arrays.epoch_order(5, 3, 7, False), np.arange(5))


def test_steps_are_keras_batches_with_the_last_one_partial():
    assert arrays.num_steps(1504, 8) == 188 and arrays.num_steps(1505, 8) == 189
    assert arrays.replica_bounds(5, 2).tolist() == [0, 3, 5]
    assert arrays.replica_bounds(1, 3).tolist() == [0, 1, 1, 1]


def test_the_pipeline_gathers_a_workers_parts_from_memory():
    """A dict of arrays (any dtypes) read back by the tf.data pipeline: each element is one replica's part."""
    x = {"pixels": np.arange(10 * 2, dtype=np.float32).reshape(10, 2), "ids": np.arange(10, dtype=np.int32)}
    data = arrays.ArrayInput((x, np.arange(10) % 3), batch_size=4, shuffle=True, seed=3)
    assert data.steps_per_epoch == 3 and data.num_examples == 10
    parts = list(data.epoch_dataset(1, 0, num_replicas=2, replica_ids=range(2)))
    assert len(parts) == 6
    order = arrays.epoch_order(10, 1, 3, True)
    got = np.concatenate([p[0]["ids"].numpy() for p in parts])
    np.testing.assert_array_equal(got, order)  # replica 0 then 1 of each step: the epoch's order
    np.testing.assert_array_equal(np.concatenate([p[0]["pixels"].numpy()[:, 1] for p in parts]), 2 * order + 1)
    np.testing.assert_array_equal(np.concatenate([p[1].numpy() for p in parts]), order % 3)
    resumed = list(data.epoch_dataset(1, 2, num_replicas=2, replica_ids=[1]))  # step 2 on, replica 1 only
    assert [p[0]["ids"].numpy().tolist() for p in resumed] == [order[8 + 1:10].tolist()]


def test_the_last_batch_is_smaller_only_when_the_examples_do_not_divide():
    def input_of(n, batch, steps=None):
        packed = (np.zeros((n, 2), "float32"), np.zeros((n,), "int64"), None)
        return arrays.ArrayInput(packed, batch, shuffle=False, seed=0, steps_per_epoch=steps)

    assert input_of(100, 32).last_batch_smaller() and not input_of(96, 32).last_batch_smaller()
    assert not input_of(100, 32, steps=2).last_batch_smaller()  # steps_per_epoch stops before the partial batch
