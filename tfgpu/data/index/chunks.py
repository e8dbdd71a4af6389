"""A pipeline's records cut into *chunks* for ``data/order``: runs of consecutive records of one shard read from one
byte offset, about ``CHUNK_BYTES`` each, or one record each when records are ``LARGE_RECORD`` bytes and more; a
chunk's bytes (from the shard's offset table) are its reader's buffer. Pure numpy over the shards' offset tables."""
import numpy as np

CHUNK_BYTES = 64 << 10  # records read together from one offset (one buffered read of small records)
MAX_CHUNK_RECORDS = 128
LARGE_RECORD = 16 << 10  # records this large are read one at a time, in a global permutation


def chunks(runs, tables: dict, filenames):
    """Chunk columns (file, index, count, offset) of ``runs`` ((file index, record indices in the shard,
    ascending), ...), and whether records are large (read one at a time). ``tables``: file index -> record
    offsets (``shards.record_table``) or None. Vectorized over all runs (a loop per run and consecutive stretch
    took a tenth of a second per order at 1M records, three orders on a resume on another topology)."""
    sizes = [(t[-1] - t[0]) / max(1, len(t) - 1) for t in (tables.get(f) for f, _ in runs) if t is not None]
    mean = float(np.mean(sizes)) if sizes else 0.0
    every_table = all(tables.get(f) is not None for f, _ in runs)
    single = every_table and mean >= LARGE_RECORD
    per_chunk = 1 if single else int(np.clip(CHUNK_BYTES // max(mean, 1.0), 1, MAX_CHUNK_RECORDS))
    runs = [(int(f), np.asarray(idx, np.int64)) for f, idx in runs if len(idx)]
    if not runs:
        return np.zeros((5, 0), np.int64), single, per_chunk, mean
    lengths = np.array([len(idx) for _, idx in runs])
    file = np.repeat(np.array([f for f, _ in runs], np.int64), lengths)
    index = np.concatenate([idx for _, idx in runs])
    n = len(index)
    # stretches: consecutive records of one run (a new run, or a gap in the indices, starts one)
    new = np.zeros(n, bool)
    new[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = True
    new[1:] |= np.diff(index) != 1
    stretch = np.flatnonzero(new)
    stretch_len = np.diff(np.append(stretch, n))
    with_table = np.array([tables.get(f) is not None for f in range(int(file.max()) + 1)])
    step = np.where(with_table[file[stretch]], per_chunk, stretch_len)  # no table: the stretch is one chunk
    into = np.arange(n) - np.repeat(stretch, stretch_len)
    first = np.flatnonzero(into % np.repeat(step, stretch_len) == 0)  # every stretch's start is a chunk's
    count = np.diff(np.append(first, n))
    chunk_file, chunk_index = file[first], index[first]
    offset = np.full(len(first), -1, np.int64)
    nbytes = np.zeros(len(first), np.int64)  # a chunk's bytes (0: unknown), from the offsets it starts and ends at
    listed = [f for f in dict.fromkeys(f for f, _ in runs) if tables.get(f) is not None]
    if listed:
        base = np.zeros(len(with_table), np.int64)
        base[listed] = np.concatenate([[0], np.cumsum([len(tables[f]) for f in listed])[:-1]])
        known = with_table[chunk_file]
        every = np.concatenate([tables[f] for f in listed])
        at = base[chunk_file[known]] + chunk_index[known]
        offset[known] = every[at]
        end = every[at + count[known]]  # a table ends with its shard's size: the last chunk's end is known too
        nbytes[known] = np.where((offset[known] >= 0) & (end >= 0), end - offset[known], 0)
    table = np.stack([chunk_file, chunk_index, count, offset, nbytes]).astype(np.int64)
    return table, single, per_chunk, mean
