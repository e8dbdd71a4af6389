"""An epoch's order as record indices, computed without reading a record, and the records read in it by offset.

A pipeline's part of an epoch (its share of the split, or its range of a later stage of an interrupted epoch) is
cut into *chunks*: runs of consecutive readable records of one shard, about ``chunks.CHUNK_BYTES`` each (small records)
or one record each (records of ``chunks.LARGE_RECORD`` bytes and more). Every epoch permutes the chunks with a seed of
(seed, epoch, stage, pipeline). Small records: the permuted chunks are grouped into *windows* of about
--shuffle_buffer records, and within a window the records of its chunks are interleaved at random (a shuffled
list of chunk numbers says which chunk the next record comes from; a chunk's records keep their shard order and
are read by one reader from the chunk's byte offset). Large records: the permutation of one-record chunks is the
epoch's order, a global shuffle, each record read on its own at its offset (a parallel map, order kept).
A tf.data service job reads an epoch as a range of units (windows, or blocks of large records) handed to its
workers one unit each (``service_epoch``).

The order is a pure function of the chunk table and the seeds, computed by TensorFlow's stateless shuffles: the
same ops in the pipeline's graph and eagerly here (``keys``). Where a run is inside an epoch is a window and a
count into it (``locate``), so a resumed pipeline starts there reading nothing before its first record, and the
shuffle holds indices, never records: its memory does not grow with the records' size (a window's open readers
each buffer their chunk's bytes, about ``CHUNK_BYTES``).
"""
import dataclasses
import functools

import numpy as np
import tensorflow as tf

from tfgpu.data.index.chunks import CHUNK_BYTES, chunks

MAX_OPEN_CHUNKS = 256  # readers open at once in a window of small records (one file handle each)
READ_PARALLEL = 16  # large records read at once (a fixed count: the autotuner's CPU budget is left to the decode)
SERVICE_BLOCK = 256  # large records in one tf.data service split (--data_service; small records: a window a split)

_no_autograph = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass(frozen=True, eq=False)
class Order:
    """One pipeline's chunks (``file``: index into ``filenames``, ``index``: first record's index in its shard,
    ``count``, ``offset``: its byte offset, -1 when the shard has no offset table) and how an epoch orders them:
    ``length`` records an epoch (the first ``length`` of each epoch's order; a share one record longer leaves
    out the record its order puts last), ``window`` chunks mixed at a time."""
    filenames: tuple
    compression: str
    file: np.ndarray
    index: np.ndarray
    count: np.ndarray
    offset: np.ndarray
    length: int
    window: int
    seed: int
    salt: int
    single: bool
    buffer_size: int
    shuffled: bool = True  # False (--shuffle_buffer=1): every epoch reads the chunks in shard order
    nbytes: np.ndarray = None  # a chunk's bytes in its shard (0: unknown): its reader's buffer, one read a chunk

    @property
    def num_chunks(self) -> int:
        return len(self.count)

    @property
    def num_windows(self) -> int:
        return -(-self.num_chunks // self.window) if self.num_chunks else 0

    @property
    def by_offset(self) -> bool:
        return bool(self.num_chunks) and bool((self.offset >= 0).all())

    @functools.cached_property
    def _tensors(self) -> "_Columns":
        """The chunk table as tensors, made once, eagerly, and captured by the traced functions that read it. Made
        inside them, every reader of a window copied the table into the graph as constants of its own (600 copies
        of 15,111 chunks at 1M records), which took seconds to trace and seconds more to instantiate."""
        with tf.init_scope():
            return _Columns(tf.constant(self.filenames, tf.string), tf.constant(self.file, tf.int64),
                            tf.constant(self.index, tf.int64), tf.constant(self.count, tf.int64),
                            tf.constant(self.offset, tf.int64),
                            tf.constant(np.zeros_like(self.count) if self.nbytes is None else self.nbytes, tf.int64))

    # -- the order (TensorFlow ops: the same in a dataset's graph and eagerly) ----------------------------------
    def _epoch_seed(self, epoch):
        return tf.stack([tf.constant(self.seed, tf.int64), tf.constant(self.salt, tf.int64)
                         + tf.cast(epoch, tf.int64) * 7919])

    def chunk_order(self, epoch):
        """The epoch's permutation of the chunks (the identity when the order is not shuffled)."""
        if not self.shuffled:
            return tf.range(self.num_chunks, dtype=tf.int64)
        return tf.random.experimental.stateless_shuffle(tf.range(self.num_chunks, dtype=tf.int64),
                                                        seed=self._epoch_seed(epoch))

    def _window_plan(self, epoch, perm, w):
        """(chunk ids, which chunk each record of window ``w`` comes from, the records' keys, their ranks in
        their chunks) of the window."""
        w = tf.cast(w, tf.int64)
        ids = perm[w * self.window:(w + 1) * self.window]
        t = self._tensors
        counts = tf.gather(t.count, ids)
        slots = tf.range(tf.size(ids, out_type=tf.int64), dtype=tf.int64)
        seed = tf.random.experimental.stateless_fold_in(self._epoch_seed(epoch), w)
        choice = tf.random.experimental.stateless_shuffle(tf.repeat(slots, counts), seed=seed)
        first = tf.cumsum(counts, exclusive=True)
        rank = tf.math.invert_permutation(tf.argsort(choice, stable=True)) - tf.cast(tf.gather(first, choice),
                                                                                     tf.int32)
        chunk = tf.gather(ids, choice)
        keys = (tf.bitwise.left_shift(tf.gather(t.file, chunk), 32) + tf.gather(t.index, chunk)
                + tf.cast(rank, tf.int64))
        return ids, choice, keys

    @functools.cached_property
    def _window_keys(self):
        """The keys of window ``w`` of ``epoch`` (``_window_plan``) as one compiled call: run eagerly, its ~30 ops
        cost about a millisecond each, most of an index audit's time at 1M records."""
        spec = tf.TensorSpec([], tf.int64)
        return tf.function(lambda epoch, w: self._window_plan(epoch, self.chunk_order(epoch), w)[2],
                           input_signature=[spec, spec], autograph=False)

    def _single_keys(self, perm):
        t = self._tensors
        return tf.bitwise.left_shift(tf.gather(t.file, perm), 32) + tf.gather(t.index, perm)

    # -- where a run is, and which records it fed (eager, no file opened) ----------------------------------------
    def locate(self, epoch: int, offset: int, perm: np.ndarray = None):
        """(window, records into it) where record ``offset`` of ``epoch``'s order lies (``perm``: the epoch's
        ``chunk_order``, if computed already)."""
        if self.single or offset == 0:
            return 0, int(offset)
        sizes = self.count[self.chunk_order(epoch).numpy() if perm is None else perm]
        ends = np.cumsum(np.add.reduceat(sizes, np.arange(0, len(sizes), self.window)))
        w = int(np.searchsorted(ends, offset, side="right"))
        return w, int(offset - (ends[w - 1] if w else 0))

    def keys(self, epoch: int, start: int = 0, count: int = None) -> np.ndarray:
        """The keys (``file_index * 2**32 + index in the shard``) of records ``[start, start + count)`` of
        ``epoch``'s order (at most to its ``length``), computed, not read."""
        end = self.length if count is None else min(self.length, start + count)
        if end <= start or not self.num_chunks:
            return np.zeros(0, np.int64)
        if self.single:
            return self._single_keys(self.chunk_order(epoch)[start:end]).numpy()
        w, k = self.locate(epoch, start)
        found, need = [], end - start
        while need > 0 and w < self.num_windows:
            keys = self._window_keys(np.int64(epoch), np.int64(w)).numpy()[k:k + need]
            found.append(keys)
            need -= len(keys)
            w, k = w + 1, 0
        return np.concatenate(found)

    def first_records(self, epoch: int, count: int) -> np.ndarray:
        """The keys of the first ``count`` records of ``epoch``'s order (at most its ``length``) as a set, in no
        particular order: every window before the one record ``count`` lies in holds all the records of its
        chunks, read off the chunk table; only that window's plan is computed (the records a resume on another
        topology finds consumed: one window's shuffle, not every window's before it)."""
        count = min(int(count), self.length)
        if count <= 0 or not self.num_chunks:
            return np.zeros(0, np.int64)
        if self.single:
            return self.keys(epoch, 0, count)
        perm = self.chunk_order(epoch).numpy()
        w, k = self.locate(epoch, count, perm)
        whole = perm[:w * self.window]
        counts = self.count[whole]
        rank = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # a record's rank in its chunk
        keys = (np.repeat(self.file[whole], counts) << 32) + np.repeat(self.index[whole], counts) + rank
        if k:  # eagerly: one window's ops cost less than tracing them
            keys = np.concatenate([keys, self._window_plan(epoch, tf.constant(perm), w)[2].numpy()[:k]])
        return keys

    # -- the records ------------------------------------------------------------------------------------------
    def _buffer(self, chunk):
        """A large record's reader buffer: the chunk's own bytes when known (one read fetches it whole), else the
        Order's ``buffer_size``."""
        nbytes = tf.gather(self._tensors.nbytes, chunk)
        return tf.where(nbytes > 0, nbytes, self.buffer_size)

    def _read(self, filename, offset, buffer_size=None):
        """A shard's records from byte ``offset`` (the start of a record's length header); ``filename`` and
        ``offset`` are scalars or vectors of one; ``buffer_size``: the read buffer's tensor, when the caller made
        one for many readers."""
        if filename.shape.rank != 1:
            filename = tf.reshape(filename, [1])
        if offset.shape.rank != 1:
            offset = tf.reshape(offset, [1])
        variant = tf.raw_ops.TFRecordDatasetV2(
            filenames=filename, compression_type="", byte_offsets=offset,
            buffer_size=tf.constant(self.buffer_size, tf.int64) if buffer_size is None else buffer_size)
        return tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.string))

    def _chunk_reader(self, chunk, used, remaining):
        """The records of chunk ``chunk`` after its first ``used``, ``remaining`` of them."""
        t = self._tensors
        return self._reader(tf.gather(t.filenames, tf.gather(t.file, chunk)), tf.gather(t.offset, chunk),
                            tf.gather(t.index, chunk), used, remaining)

    def _reader(self, filename, offset, index, used, remaining, buffer_size=None):
        """The records of a chunk (its shard ``filename``, byte ``offset``, first record ``index``) after its first
        ``used``, ``remaining`` of them."""
        if self.by_offset:
            records = self._read(filename, offset, buffer_size)
        else:  # no offset table (a gzip shard): from the shard's start, skipping to the chunk (headers only)
            records = tf.data.TFRecordDataset(tf.reshape(filename, []),
                                              "GZIP" if self.compression == "gzip" else None)
            used = used + tf.reshape(index, [])
        return records.skip(used).take(remaining)

    def _window_records(self, epoch, perm, w, k, cached):
        """(key, record) of window ``w`` from its record ``k``."""
        ids, choice, keys = self._window_plan(epoch, perm, w)
        m = tf.size(ids, out_type=tf.int64)
        used = tf.math.unsorted_segment_sum(tf.ones_like(choice[:k]), choice[:k], m)
        t = self._tensors
        counts = tf.gather(t.count, ids)
        keys, choice = keys[k:], choice[k:]
        if cached is not None:
            return tf.data.Dataset.from_tensor_slices((keys, self.positions(keys))).map(
                lambda key, p: (key, tf.gather(cached, p)))
        pad = self.window - m
        ids = tf.concat([ids, tf.zeros([pad], tf.int64)], 0)
        used = tf.concat([used, tf.zeros([pad], tf.int64)], 0)
        remaining = tf.concat([counts, tf.zeros([pad], tf.int64)], 0) - used
        # Each reader's shard, offset, first record (gzip), records used and left: gathered for the window, then
        # split by one op per column (a slice per reader and column was 700 ops to trace at a window of 147
        # chunks; tf.unstack instead crashed TensorFlow 2.21 in make_iterator).
        names, offsets = (tf.split(c, self.window) for c in (tf.gather(t.filenames, tf.gather(t.file, ids)),
                                                              tf.gather(t.offset, ids)))
        first = tf.split(tf.gather(t.index, ids), self.window) if not self.by_offset else [None] * self.window
        used, remaining = ([tf.squeeze(x, 0) for x in tf.split(c, self.window)] for c in (used, remaining))
        buffer_size = tf.constant(self.buffer_size, tf.int64)  # one for the window's readers
        readers = [self._reader(names[j], offsets[j], first[j], used[j], remaining[j], buffer_size)
                   for j in range(self.window)]
        records = (readers[0] if self.window == 1 else
                   tf.data.Dataset.choose_from_datasets(readers, tf.data.Dataset.from_tensor_slices(choice)))
        return tf.data.Dataset.zip(tf.data.Dataset.from_tensor_slices(keys), records)

    def positions(self, keys):
        """Where records ``keys`` are in the table order ``table_records`` reads them in (what a pipeline holding
        its records in memory gathers by)."""
        starts = np.concatenate([[0], np.cumsum(self.count)[:-1]]).astype(np.int64)
        # a key's chunk: the last chunk (in key order) starting at or before it
        order = np.lexsort((self.index, self.file))
        table_keys = (self.file[order].astype(np.int64) << 32) + self.index[order]
        chunk = tf.gather(tf.constant(order, tf.int64),
                          tf.searchsorted(tf.constant(table_keys, tf.int64), keys, side="right") - 1)
        first_key = tf.gather(tf.constant((self.file.astype(np.int64) << 32) + self.index, tf.int64), chunk)
        return tf.gather(tf.constant(starts, tf.int64), chunk) + keys - first_key

    def _single_records(self, perm, cached):
        keys = self._single_keys(perm)
        if cached is not None:
            return tf.data.Dataset.from_tensor_slices((keys, self.positions(keys))).map(
                lambda key, p: (key, tf.gather(cached, p)))
        t = self._tensors  # a record's shard name looked up as it is read: no string per record

        def read(chunk):  # one record, read in a map: no reader dataset handed between threads per record
            filename = tf.gather(t.filenames, tf.gather(t.file, chunk))
            return self._read(filename, tf.gather(t.offset, chunk), self._buffer(chunk)).take(1).get_single_element()

        records = tf.data.Dataset.from_tensor_slices(perm).map(_no_autograph(read), num_parallel_calls=READ_PARALLEL,
                                                               deterministic=True)
        return tf.data.Dataset.zip(tf.data.Dataset.from_tensor_slices(keys), records)

    def epoch_records(self, epoch, w0=0, k0=0, cached=None):
        """(key, record) of ``epoch``'s order from window ``w0``, record ``k0`` into it (``locate``), to its end
        (the caller takes ``length``)."""
        perm = self.chunk_order(epoch)
        if self.single:
            return self._single_records(perm[k0:], cached)
        w0 = tf.cast(w0, tf.int64)
        return tf.data.Dataset.range(w0, self.num_windows).flat_map(_no_autograph(
            lambda w: self._window_records(epoch, perm, w, tf.where(w == w0, tf.cast(k0, tf.int64), 0), cached)))

    def service_epoch(self, epoch, offset=0):
        """(key, record) of records ``[offset, length)`` of ``epoch``'s order as a tf.data service job reads them:
        a ``Dataset.range`` of *units* (the order's windows of small records, blocks of ``SERVICE_BLOCK`` large
        ones), each unit flat-mapped to its records. The range is the dataset's only source, so the service's
        dynamic sharding hands every unit to one worker: the epoch's records once between them, in an order
        that is the workers' (each unit's records in the epoch's order), the shuffle holding indices."""
        if not self.num_chunks:
            return tf.data.Dataset.range(0).map(lambda i: (i, tf.constant(b"")))
        perm = self.chunk_order(epoch)
        offset, length = tf.cast(offset, tf.int64), tf.constant(self.length, tf.int64)
        if self.single:
            block = SERVICE_BLOCK

            def block_records(u):
                lo, hi = tf.maximum(u * block, offset), tf.minimum((u + 1) * block, length)
                return self._single_records(perm[lo:tf.maximum(lo, hi)], None)

            return tf.data.Dataset.range(offset // block, -(-self.length // block)).flat_map(
                _no_autograph(block_records))
        sizes = tf.gather(tf.constant(self.count, tf.int64), perm)
        per_window = tf.math.unsorted_segment_sum(sizes, tf.range(self.num_chunks, dtype=tf.int64) // self.window,
                                                  self.num_windows)
        ends = tf.cumsum(per_window)
        begins = ends - per_window

        def window_records(w):
            k = tf.maximum(offset - begins[w], 0)
            n = tf.maximum(tf.minimum(ends[w], length) - begins[w] - k, 0)
            return self._window_records(epoch, perm, w, k, None).take(n)

        first = tf.searchsorted(ends, tf.reshape(offset, [1]), side="right")[0]
        last = tf.searchsorted(begins, tf.reshape(length, [1]), side="left")[0]
        return tf.data.Dataset.range(tf.cast(first, tf.int64), tf.cast(last, tf.int64)).flat_map(
            _no_autograph(window_records))

    def table_records(self):
        """Every record of the chunks once, in table order (what a pipeline holds in memory; ``positions`` counts on
        that order, so the chunks are read one after the other: an interleave of several chunks a record at a time
        put records where other keys expect them, and a resume then fed some twice). Read once, in the first
        epoch."""
        chunks = tf.data.Dataset.range(self.num_chunks)
        return chunks.flat_map(_no_autograph(lambda c: self._chunk_reader(c, tf.constant(0, tf.int64), tf.gather(
            self._tensors.count, c))))

    def stream(self, start_epoch: int, offset: int, cache: bool = False,
               epochs: int = None):
        """(key, record) of this order's epochs from record ``offset`` of ``start_epoch`` on (``epochs`` of
        them, or endless), each ``length`` records; nothing before ``offset`` is read."""
        w0, k0 = self.locate(start_epoch, offset)
        end = (1 << 40) if epochs is None else start_epoch + epochs

        def epoch(e, cached=None):
            first = tf.equal(e, start_epoch)
            records = self.epoch_records(e, tf.where(first, np.int64(w0), 0), tf.where(first, np.int64(k0), 0),
                                         cached)
            return records.take(tf.where(first, np.int64(self.length - offset), self.length))

        epochs_ds = tf.data.Dataset.range(start_epoch, end)
        if not cache:
            return epochs_ds.flat_map(_no_autograph(epoch))
        everything = self.table_records().batch(max(1, int(self.count.sum()))).take(1).cache()
        return everything.flat_map(_no_autograph(lambda records: epochs_ds.flat_map(_no_autograph(
            lambda e: epoch(e, records)))))


    def epoch_keys(self, epoch, w0=0, k0=0):
        """The keys of ``epoch``'s order from window ``w0``, record ``k0`` into it (``locate``), to its end, as one
        vector: the same keys ``epoch_records`` reads, computed without a record (a pipeline holding its records in
        memory gathers a batch at a time by them)."""
        perm = self.chunk_order(epoch)
        if self.single:
            return self._single_keys(perm[tf.cast(k0, tf.int64):])
        w0, k0 = tf.cast(w0, tf.int64), tf.cast(k0, tf.int64)

        def window(w, keys):
            found = self._window_plan(epoch, perm, w)[2]
            return w + 1, tf.concat([keys, found[tf.where(w == w0, k0, 0):]], 0)

        _, keys = tf.while_loop(lambda w, _: w < self.num_windows, window, (w0, tf.zeros([0], tf.int64)),
                                shape_invariants=(w0.shape, tf.TensorShape([None])))
        return keys

    def stream_keys(self, start_epoch: int, offset: int, epochs: int = None):
        """The keys of ``stream``'s records, one vector an epoch (the first from record ``offset`` of
        ``start_epoch``), ``length`` records each: ``stream`` without reading."""
        w0, k0 = self.locate(start_epoch, offset)
        end = (1 << 40) if epochs is None else start_epoch + epochs

        def epoch(e):
            first = tf.equal(e, start_epoch)
            if not self.num_chunks:
                return tf.zeros([0], tf.int64)
            keys = self.epoch_keys(e, tf.where(first, np.int64(w0), 0), tf.where(first, np.int64(k0), 0))
            return keys[:tf.where(first, np.int64(self.length - offset), self.length)]

        return tf.data.Dataset.range(start_epoch, end).map(_no_autograph(epoch))


@dataclasses.dataclass(frozen=True)
class _Columns:
    """An Order's chunk table as tensors (``Order._tensors``)."""
    filenames: tf.Tensor
    file: tf.Tensor
    index: tf.Tensor
    count: tf.Tensor
    offset: tf.Tensor
    nbytes: tf.Tensor


def build(info, split: str, runs, length: int, seed: int, salt: int, shuffle_buffer: int) -> Order:
    """The Order of ``runs`` ((file index in the split, record indices in the shard), ...) of ``split``."""
    files = info.split_files[split]
    tables = {f: info.tables.get(files[f][0]) for f, _ in runs}
    table, single, per_chunk, mean = chunks(runs, tables, files)
    if single:
        window = 1
    else:
        window = int(np.clip(shuffle_buffer // per_chunk, 1, MAX_OPEN_CHUNKS)) if shuffle_buffer > 1 else 1
        window = max(1, min(window, table.shape[1]))  # no more readers than chunks
    buffer_size = int(np.clip(per_chunk * (mean + 16), 1 << 12, CHUNK_BYTES + (1 << 12)))
    return Order(tuple(f for f, _ in files), info.compression, table[0], table[1], table[2], table[3], int(length),
                 window, int(seed), int(salt), single, buffer_size, shuffled=shuffle_buffer > 1, nbytes=table[4])
