"""Crash-safe file writes: a reader sees the old file or the whole new one, never half."""
import contextlib
import os
import tempfile


def fsync_dir(path):
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _default_mode() -> int:
    """The mode a plain open() would give a new file (0666 less the umask); mkstemp's is 0600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ".tmp"):
    """Yields a temporary path beside ``path`` to write; on success it is fsynced, given the usual permissions
    and renamed to ``path``; on any failure it is removed, so ``path`` is never half written. ``suffix`` is for
    writers that insist on an extension (Keras wants ``.keras``)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that readers see the old file or the whole new one."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
