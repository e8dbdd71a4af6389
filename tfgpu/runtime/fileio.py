"""The files of a run, on the local disk or on any file system TensorFlow has (``gs://``, ``ram://``, a plugin's
``s3://``), and crash-safe writes of them.

A path with a scheme (``scheme://...``) goes through ``tf.io.gfile``; a plain path goes through ``os`` as
before, so local files keep their POSIX guarantees and modules that use only local files never import
TensorFlow. Errors of either kind come out as ``OSError`` (``FileNotFoundError`` for a missing file), so a
caller handles both the same way. ``check_scheme`` refuses a scheme the installed TensorFlow cannot open, in
one line naming the flag, before any work.

What an atomic write (``atomic_path``, ``atomic_write_bytes``, ``atomic_local_path``) guarantees:

- **Local (POSIX) paths**: the data goes to a temporary file beside the target, is fsynced, given the mode a
  plain ``open()`` would give (0666 less the umask) and renamed over the target (``os.replace``, atomic), and
  the directory is fsynced. A reader sees the old file or the whole new one, never half; a crash leaves the old.
- **Paths with a scheme**: the data goes to a temporary name beside the target
  (``.<name>.<random>.tmp``), then ``tf.io.gfile.rename(overwrite=True)``. That is atomic only where the file
  system's rename is: on ``ram://`` it is one in-process step. On object stores (``gs://``, ``s3://``)
  TensorFlow's rename is a copy followed by a delete, not atomic: a crash between the two can leave the
  temporary object behind, and whether a reader can see a partly copied object is up to the store. No
  fsync and no permissions there. (TensorFlow writes its own checkpoint index the same way.)
"""
import contextlib
import os
import posixpath
import shutil
import tempfile
import uuid

# Schemes that TensorFlow's own builds lack and the tensorflow-io package adds when imported.
_TFIO_SCHEMES = ("s3", "hdfs", "viewfs", "har", "az", "http", "https")


def has_scheme(path) -> bool:
    """True for ``scheme://...`` paths, which go through ``tf.io.gfile``."""
    return "://" in str(path)


def scheme(path) -> str:
    return str(path).split("://", 1)[0] if has_scheme(path) else ""


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


@contextlib.contextmanager
def _as_oserror(path):
    """TensorFlow's file errors as the OSError a local call would raise."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.NotFoundError as e:
        raise FileNotFoundError(2, e.message.split("\n")[0], str(path)) from None
    except tf.errors.AlreadyExistsError as e:
        raise FileExistsError(17, e.message.split("\n")[0], str(path)) from None
    except tf.errors.PermissionDeniedError as e:
        raise PermissionError(13, e.message.split("\n")[0], str(path)) from None
    except tf.errors.OpError as e:
        raise OSError(5, e.message.split("\n")[0], str(path)) from None


# -- path arithmetic ------------------------------------------------------------------------------------------------

def absolute(path: str) -> str:
    """``os.path.abspath`` for a local path; a path with a scheme is already absolute (it is only normalised)."""
    if not has_scheme(path):
        return os.path.abspath(path)
    head, rest = str(path).split("://", 1)
    return f"{head}://{posixpath.normpath(rest)}" if rest else str(path)


def parent(path: str) -> str:
    """The directory that holds ``path`` (absolute for a local path)."""
    return os.path.dirname(absolute(path).rstrip("/"))


# -- reading and inspecting -----------------------------------------------------------------------------------------

def exists(path: str) -> bool:
    if not has_scheme(path):
        return os.path.exists(path)
    with _as_oserror(path):
        return _gfile().exists(path)


def isdir(path: str) -> bool:
    if not has_scheme(path):
        return os.path.isdir(path)
    with _as_oserror(path):
        return _gfile().isdir(path)


def isfile(path: str) -> bool:
    if not has_scheme(path):
        return os.path.isfile(path)
    return exists(path) and not isdir(path)


def listdir(path: str) -> list:
    """The names in directory ``path`` (FileNotFoundError when there is none)."""
    if not has_scheme(path):
        return os.listdir(path)
    with _as_oserror(path):
        if not _gfile().isdir(path):
            raise FileNotFoundError(2, "no such directory", path)
        return [name.rstrip("/") for name in _gfile().listdir(path)]


def glob(pattern: str) -> list:
    if not has_scheme(pattern):
        import glob as glob_lib

        return glob_lib.glob(pattern)
    with _as_oserror(pattern):
        return _gfile().glob(pattern)


@contextlib.contextmanager
def open_file(path: str, mode: str = "r"):
    """``open(path, mode)`` (UTF-8 in text mode) or, with a scheme, ``tf.io.gfile.GFile``; errors as OSError."""
    if not has_scheme(path):
        with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        return
    with _as_oserror(path):
        with _gfile().GFile(path, mode) as f:
            yield f


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def read_text(path: str, errors: str = "strict") -> str:
    return read_bytes(path).decode("utf-8", errors)


def append_text(path: str, text: str) -> None:
    """Appends ``text`` (an object store without appends rewrites the whole object each time)."""
    with open_file(path, "a") as f:
        f.write(text)
        f.flush()


# -- changing -------------------------------------------------------------------------------------------------------

def makedirs(path: str) -> None:
    """Creates ``path`` and its parents; nothing when it exists already."""
    if not has_scheme(path):
        os.makedirs(path, exist_ok=True)
        return
    with _as_oserror(path):
        _gfile().makedirs(path)


def remove(path: str, missing_ok: bool = False) -> None:
    if not has_scheme(path):
        if missing_ok:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        else:
            os.unlink(path)
        return
    try:
        with _as_oserror(path):
            _gfile().remove(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def rename(source: str, target: str) -> None:
    """Renames ``source`` over ``target`` (atomic locally; a copy and a delete on object stores)."""
    if not has_scheme(source) and not has_scheme(target):
        os.replace(source, target)
        return
    with _as_oserror(target):
        _gfile().rename(source, target, overwrite=True)


def rmtree(path: str) -> None:
    """Removes directory ``path`` and everything in it; nothing when it is missing."""
    if not has_scheme(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    import tensorflow as tf

    with _as_oserror(path):
        try:
            _gfile().rmtree(path)
        except tf.errors.NotFoundError:
            pass  # gone already, or (ram://) a directory never made explicitly: its files are removed first


def copy_tree(local_dir: str, target: str) -> None:
    """Copies a local directory's files to ``target`` (any path), file by file: not atomic as a whole."""
    for root, _, files in os.walk(local_dir):
        where = os.path.join(target, os.path.relpath(root, local_dir)) if root != local_dir else target
        makedirs(where)
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                atomic_write_bytes(os.path.join(where, name), f.read())


# -- atomic writes ----------------------------------------------------------------------------------------------------

def fsync_dir(path):
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only set it: setting it to 0 for a moment
    would let another thread create a world-writable file): Linux's /proc/self/status, else the mode a probe
    file in a private temporary directory gets."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    with tempfile.TemporaryDirectory(prefix="tfgpu-umask-") as private:
        fd = os.open(os.path.join(private, "probe"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o777)
        try:
            return 0o777 & ~os.fstat(fd).st_mode
        finally:
            os.close(fd)


def default_mode(directory: bool = False) -> int:
    """The mode a plain open() (``directory``: os.mkdir) would give: 0666 (0777) less the umask; mkstemp's is
    0600, mkdtemp's 0700."""
    return (0o777 if directory else 0o666) & ~current_umask()


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ".tmp"):
    """Yields a temporary path beside ``path`` to write; on success it becomes ``path`` (see the module docstring
    for what that guarantees where); on any failure it is removed, so ``path`` is never half written. ``suffix`` is
    for writers that insist on an extension (Keras wants ``.keras``)."""
    if has_scheme(path):
        with _remote_atomic_path(path, suffix) as tmp:
            yield tmp
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


@contextlib.contextmanager
def _remote_atomic_path(path: str, suffix: str):
    head, name = posixpath.split(str(path).rstrip("/"))
    tmp = posixpath.join(head, f".{name}.{uuid.uuid4().hex[:8]}{suffix}")
    try:
        yield tmp
        rename(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            remove(tmp, missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_local_path(path: str, suffix: str = ".tmp"):
    """Like ``atomic_path``, but the yielded path is always on the local disk, for writers that can only write
    local files (Keras' ``.keras`` saving): for a path with a scheme the finished file is then copied beside
    ``path`` and renamed over it."""
    if not has_scheme(path):
        with atomic_path(path, suffix) as tmp:
            yield tmp
        return
    with tempfile.TemporaryDirectory(prefix="tfgpu-upload-") as local:
        tmp = os.path.join(local, "file" + suffix)
        yield tmp
        with open(tmp, "rb") as f:
            atomic_write_bytes(path, f.read())


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that readers see the old file or the whole new one (where the file system's
    rename is atomic: see the module docstring)."""
    with atomic_path(path) as tmp:
        with open_file(tmp, "wb") as f:
            f.write(data)


# -- schemes ----------------------------------------------------------------------------------------------------------

def unsupported_scheme(path: str) -> str:
    """Why the installed TensorFlow cannot open ``path`` ("" when it can, or when the path is local)."""
    wanted = scheme(path)
    if not wanted:
        return ""
    import tensorflow as tf

    if wanted not in tf.io.gfile.get_registered_schemes() and wanted in _TFIO_SCHEMES:
        import importlib.util

        if importlib.util.find_spec("tensorflow_io") is not None:
            import tensorflow_io  # noqa: F401 (registers its file systems)
    known = [s for s in tf.io.gfile.get_registered_schemes() if s and s != "file"]
    if wanted in known or wanted == "file":
        return ""
    plugin = ("a file system plugin built for this TensorFlow: tensorflow-io's (tfgpu imports tensorflow_io when it "
              "is installed)" if wanted in _TFIO_SCHEMES else "a TensorFlow file system plugin for it")
    return (f"{str(path)!r}: TensorFlow {tf.__version__} has no {wanted}:// file system (it has "
            f"{', '.join(s + '://' for s in sorted(known))} and local paths); {wanted}:// needs {plugin}")


def check_scheme(path: str, flag: str) -> None:
    """Raises ConfigError naming ``flag`` when ``path`` has a scheme the installed TensorFlow cannot open."""
    reason = unsupported_scheme(path) if path else ""
    if reason:
        from tfgpu.config import ConfigError

        raise ConfigError(flag, reason)


def check_schemes(paths: dict) -> None:
    """``check_scheme`` for each ``{flag: path}``."""
    for flag, path in paths.items():
        check_scheme(path, flag)
