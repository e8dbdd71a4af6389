"""Console logging for entrypoints: tfgpu's own lines, timestamped, on stderr (TensorFlow's stay apart)."""
import logging
import sys


def setup(level: int = logging.INFO) -> logging.Logger:
    """Routes the "tfgpu" logger to stderr as ``HH:MM:SS I tfgpu] message``; safe to call twice."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s tfgpu] %(message)s", datefmt="%H:%M:%S"))
    logger = logging.getLogger("tfgpu")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    return logger
