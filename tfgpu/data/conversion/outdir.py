"""The output directory of a conversion: who may write it, and how a dataset in it is replaced.

- ``claim`` checks that the directory is empty or holds this same conversion (or
  ``--overwrite``) and lies apart from a folder source, locks it against a second
  converter and records the plan. It changes nothing that a reader uses: no shard,
  no ``dataset.json``.
- ``check_space`` refuses a conversion estimated not to fit; ``reporting_no_space``
  turns a device that fills up anyway into one line naming the directory.
- While a finished dataset (``dataset.json``) is there, rebuilt shards are written
  beside it under staged names (``.<shard>.staged``); ``publish`` swaps them in only
  once every shard is done. So a rerun that stops (a bad image, a kill, a refused
  dataset) leaves the dataset that was there readable and unchanged.
- Without a finished dataset, shards are written in place (each atomically) and
  reused by the next run, which is what lets a killed conversion resume.

Every path written is a shard name built from a validated split name inside the
directory (``inside`` checks it), so nothing is ever written outside ``--output_dir``.

``--output_dir`` may be any path TensorFlow opens (``gs://``, ``ram://``; ``tfgpu.runtime.fileio``). Only a
local directory is locked against a second converter (``flock``); on a path with a scheme there is no lock,
so running one converter per output directory is then up to the user, and shards are renamed into place
the way that file system renames (not atomic on object stores).
"""
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil

from tfgpu.config import ConfigError
from tfgpu.data.sources.folders import display
from tfgpu.runtime import fileio
from tfgpu.runtime.fileio import atomic_write_bytes

STATE_DIR = ".tfgpu-convert"
MANIFEST = "dataset.json"  # tfrecord.MANIFEST (not imported: this module stays free of TensorFlow)
SHARD_FILE = re.compile(r"^[A-Za-z0-9_-]+-\d{5}-of-\d{5}\.tfrecord$")
TEMP_FILE = re.compile(r"^\.([A-Za-z0-9_-]+-\d{5}-of-\d{5}\.tfrecord|dataset\.json|.+\.json)\..+\.tmp$")
STAGED_FILE = re.compile(r"^\.([A-Za-z0-9_-]+-\d{5}-of-\d{5}\.tfrecord)\.staged$")


def staged_path(path: str) -> str:
    """Where a shard is written while a finished dataset still holds ``path``."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.staged")


def inside(directory: str, path: str) -> str:
    """``path`` if it lies in ``directory`` (after resolving ``..``), else a RuntimeError: a guard, not a check of
    input (split names are validated where they are read)."""
    real = fileio.absolute if fileio.has_scheme(directory) else os.path.realpath
    if os.path.dirname(real(path)) != real(directory):
        raise RuntimeError(f"refusing to write {path}: not a file directly in {directory}")
    return path


def same_or_inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it, however either is spelled: ``..``, relative paths and
    symlinks are resolved (``realpath``), and each existing ancestor of ``path`` is compared with ``folder`` by
    device and inode, which also sees through bind mounts. Costs one ``stat`` per path component."""
    if fileio.has_scheme(path) or fileio.has_scheme(folder):
        inner, outer = (fileio.absolute(p).rstrip("/") + "/" for p in (path, folder))
        return inner.startswith(outer)
    try:
        target = os.stat(folder)
    except OSError:
        return False
    here = os.path.realpath(path)
    while True:
        with contextlib.suppress(OSError):
            st = os.stat(here)
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return True
        up = os.path.dirname(here)
        if up == here:
            return False
        here = up


def check_apart(directory: str, source_folder: str) -> None:
    """Refuses an output directory that is, or lies inside, the source folder (the dataset would be written into
    the images it is made of, and read as part of them by the next run), and a source folder inside the output
    directory (``--overwrite`` would replace what holds it)."""
    shown, source = display(directory), display(source_folder)
    if same_or_inside(directory, source_folder):
        raise ConfigError("output_dir", f"{shown} is inside the source folder {source} (after resolving symlinks "
                          "and '..'); choose an output directory outside it")
    if same_or_inside(source_folder, directory):
        raise ConfigError("output_dir", f"{shown} holds the source folder {source} (after resolving symlinks and "
                          "'..'); choose an output directory outside it")


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full device, an exhausted quota


def is_out_of_space(error: BaseException) -> bool:
    """Whether ``error`` says the device (or the user's quota) is full: an OSError, or TensorFlow's file writers'
    ResourceExhaustedError (recognised by name: this module stays free of TensorFlow)."""
    if isinstance(error, OSError):
        return error.errno in NO_SPACE
    return type(error).__name__ == "ResourceExhaustedError" and type(error).__module__.startswith("tensorflow")


def free_bytes(directory: str):
    """Bytes this user may still write where ``directory`` lives; None for a path with a scheme (no such number)."""
    if fileio.has_scheme(directory):
        return None
    with contextlib.suppress(OSError):
        return shutil.disk_usage(directory).free
    return None


def megabytes(n: float) -> str:
    return f"{n / 2 ** 20:.1f} MiB"


def check_space(directory: str, needed: int) -> None:
    """Refuses, before anything is written, a conversion estimated to need more than the free space there."""
    free = free_bytes(directory)
    if free is not None and needed > free:
        raise ConfigError("output_dir", f"{display(directory)} has {megabytes(free)} free but this conversion needs "
                          f"about {megabytes(needed)}; free some space there or choose another directory")


@contextlib.contextmanager
def reporting_no_space(directory: str, needed: int):
    """Turns the device filling up while writing into ``directory`` into one line naming it and the space needed;
    what was written stays as an interrupted run leaves it (complete shards are kept for the rerun)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 (only running out of space is translated; anything else is re-raised)
        if not is_out_of_space(e):
            raise
        free = free_bytes(directory)
        raise ConfigError("output_dir", f"{display(directory)} ran out of space (no space left on device) while "
                          f"writing the dataset: it needs about {megabytes(needed)}"
                          f"{f', {megabytes(free)} is free now' if free is not None else ''}; free some space there "
                          "or choose another directory, then rerun (complete shards are kept)") from None


def fingerprint(options: dict, identity: str) -> str:
    """Identifies a conversion: the source and every option that changes the output (not workers/skip_bad)."""
    key = {"converter": 1, "source": identity, **{k: options[k] for k in (
        "split", "seed", "image_format", "resize", "num_shards", "shard_size_mb", "compression")},
        "jpeg_quality": options["jpeg_quality"] if options["image_format"] == "jpeg" else None}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def existing_fingerprint(directory: str):
    """(fingerprint, what) of the conversion already in ``directory``, if any."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        manifest = json.loads(fileio.read_bytes(os.path.join(directory, MANIFEST)))
        return (manifest.get("converter") or {}).get("fingerprint"), "another dataset (dataset.json)"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        plan = json.loads(fileio.read_bytes(os.path.join(directory, STATE_DIR, "plan.json")))
        return plan.get("fingerprint"), "an unfinished conversion of a different source or options"
    return None, None


def remove_temp_files(directory: str):
    for folder in (directory, os.path.join(directory, STATE_DIR)):
        with contextlib.suppress(FileNotFoundError):
            for name in fileio.listdir(folder):
                if TEMP_FILE.match(name):
                    fileio.remove(os.path.join(folder, name), missing_ok=True)


def make_readable(path: str):
    """Temporary files are created 0600; a dataset is meant to be shared, so give it the umask's mode (local files:
    a path with a scheme has no modes)."""
    if fileio.has_scheme(path):
        return
    with contextlib.suppress(OSError):
        os.chmod(path, fileio.default_mode())


@contextlib.contextmanager
def claim(options, source_kind: str, source_path: str, key: str):
    """Checks the output directory may take this conversion, locks it against a second converter, yields it.

    ``options`` is the converter's Options; ConfigError names --output_dir for anything in the way."""
    directory = fileio.absolute(options.output_dir)
    shown = display(directory)
    if source_kind == "folder":
        check_apart(directory, source_path)
    if fileio.exists(directory) and not fileio.isdir(directory):
        raise ConfigError("output_dir", f"{shown} exists and is not a directory")
    try:
        fileio.makedirs(directory)
        entries = [e for e in fileio.listdir(directory) if e != STATE_DIR and not TEMP_FILE.match(e)]
    except OSError as e:
        raise ConfigError("output_dir", f"cannot create or list {shown}: {e.strerror or e}") from None
    existing, what = existing_fingerprint(directory)
    if entries and existing != key and not options.overwrite:
        what = what or f"{len(entries)} file(s) that are not a tfgpu conversion"
        raise ConfigError("output_dir", f"{shown} is not empty: it holds {what}; choose an empty directory "
                          "or pass --overwrite to replace it")
    state = os.path.join(directory, STATE_DIR)
    try:
        fileio.makedirs(state)
        lock = contextlib.nullcontext() if fileio.has_scheme(state) else open(os.path.join(state, "lock"), "a")
    except OSError as e:
        raise ConfigError("output_dir", f"cannot write to {shown}: {e.strerror or e}") from None
    with lock:
        try:
            if not fileio.has_scheme(state):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError("output_dir", f"another tfgpu.convert is writing to {shown}") from None
        try:
            remove_temp_files(directory)
            atomic_write_bytes(os.path.join(state, "plan.json"), json.dumps(
                {"fingerprint": key, "options": dataclasses.asdict(options)}, indent=2, sort_keys=True).encode())
        except OSError as e:
            raise ConfigError("output_dir", f"cannot write to {shown}: {e.strerror or e}") from None
        yield directory


def publish(directory: str, tasks: list, results: list, write_manifest) -> None:
    """Makes the finished shards the dataset: the old manifest goes, staged shards are swapped in, files of earlier
    plans are removed, and ``write_manifest()`` writes the new manifest last."""
    fileio.remove(os.path.join(directory, MANIFEST), missing_ok=True)
    for task, result in zip(tasks, results):
        if result.get("staged"):
            fileio.rename(staged_path(task["path"]), task["path"])
    remove_stale(directory, {os.path.basename(t["path"]) for t in tasks})
    write_manifest()
    make_readable(os.path.join(directory, MANIFEST))


def remove_stale(directory: str, keep: set):
    """Shards (and sidecars, staged shards) of this directory that the new manifest does not list: earlier plans."""
    for name in fileio.listdir(directory):
        if (SHARD_FILE.match(name) and name not in keep) or STAGED_FILE.match(name):
            fileio.remove(os.path.join(directory, name))
    state = os.path.join(directory, STATE_DIR)
    for name in fileio.listdir(state):
        if name.endswith(".tfrecord.json") and name[:-len(".json")] not in keep:
            fileio.remove(os.path.join(state, name))
