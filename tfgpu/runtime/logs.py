"""Console logging for entrypoints: tfgpu's own lines, timestamped, on stderr (TensorFlow's stay apart), each on a
line of its own while a progress bar is drawn (``runtime.progress``)."""
import contextlib
import logging
import os
import sys
import tempfile

from tfgpu.runtime import progress


class _LineHandler(logging.StreamHandler):
    """A stream handler that ends an open progress bar's line before each record, so the record starts a line."""

    def emit(self, record):
        progress.break_line()
        super().emit(record)


def setup(level: int = logging.INFO) -> logging.Logger:
    """Routes the "tfgpu" logger to stderr as ``HH:MM:SS I tfgpu] message``; safe to call twice."""
    handler = _LineHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s tfgpu] %(message)s", datefmt="%H:%M:%S"))
    logger = logging.getLogger("tfgpu")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    return logger


@contextlib.contextmanager
def quiet_native_startup(show: bool = False):
    """Holds back what TensorFlow's C++ runtime prints on file descriptor 2 while it is imported (absl's lines
    from before its log is initialised, which TF_CPP_MIN_LOG_LEVEL does not silence: CUDA stubs, oneDNN, CPU
    features); they are printed after all when the import fails, or when ``show``. A no-op once TensorFlow is
    imported."""
    if show or "tensorflow" in sys.modules:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                held.seek(0)
                sys.stderr.write(held.read().decode("utf-8", "replace"))
                sys.stderr.flush()
