"""data/chunks: a pipeline's records cut into chunks read from one offset each."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu.data.index import chunks


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=5), keep=st.sampled_from([0.3, 0.9, 1.0]),
       record_bytes=st.sampled_from([40, 3000, chunks.LARGE_RECORD]), gzip=st.lists(st.booleans(), max_size=5),
       seed=st.integers(0, 99))
def test_chunks_cover_each_record_of_the_runs_once_in_stretches_of_one_shard(sizes, keep, record_bytes, gzip, seed):
    """chunks.chunks: every record of every run once, in run order; a chunk is consecutive records of one shard,
    at most per_chunk of them where the shard has an offset table (read from the chunk's offset), one whole stretch
    where it has none (read from the shard's start)."""
    rng = np.random.default_rng(seed)
    tables = {f: None if f < len(gzip) and gzip[f] else np.arange(n + 1, dtype=np.int64) * (record_bytes + 16) + f
              for f, n in enumerate(sizes)}
    runs = [(f, np.flatnonzero(rng.random(n) < keep)) for f, n in enumerate(sizes)]
    table, single, per_chunk, _ = chunks.chunks(runs, tables, None)
    file, index, count, offset, nbytes = table
    covered = [(f, i) for f, first, n in zip(file, index, count) for i in range(first, first + n)]
    assert covered == [(f, int(i)) for f, idx in runs for i in idx]  # each record once, in order
    for f, first, n, at, size in zip(file, index, count, offset, nbytes):
        stretch = set(range(first, first + n))
        assert stretch <= set(runs[f][1].tolist())  # consecutive records of one shard, all in the run
        if tables[f] is None:
            assert at == -1 and size == 0 and first + n not in runs[f][1] and first - 1 not in runs[f][1]
        else:  # a chunk's bytes: from its first record's offset to the next record's (or the shard's end)
            assert at == tables[f][first] and 1 <= n <= per_chunk and size == tables[f][first + n] - at
    assert not single or per_chunk == 1
