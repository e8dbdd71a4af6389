"""The one line every corpus script ends with: ``CORPUS_RESULT <json>``.

The harness (tests/training/fit/test_corpus.py) compares a script's plain-Keras run with its ported runs through
this line alone, so it holds what a port must reproduce: the last value of every History key, a digest and a sum
of the trained weights (equal digests on every worker show that the workers ended with one model), and what the
script's own objects gave when it used them after fit. It is imported by the scripts as ``import corpus_report``
(the harness puts this directory on PYTHONPATH) and never imports tfgpu, so a plain run stays plain Keras.
"""
import hashlib
import json
import math

import numpy as np

PREFIX = "CORPUS_RESULT "


def plain(value):
    """``value`` as JSON-able Python: numpy and tensor scalars -> float/int, shapes and arrays -> lists."""
    if hasattr(value, "numpy"):  # a tf.Tensor or a Keras variable
        value = value.numpy()
    if hasattr(value, "as_list"):  # a tf.TensorShape
        value = value.as_list()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist()) if value.ndim else plain(value.item())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"corpus_report: cannot report a {type(value).__name__}: {value!r}")


def weights_digest(model):
    """(sha256 hex, float64 sum) over every variable of ``model``, in ``model.weights`` order. ``v.numpy()`` since
    a variable made under a distribution strategy refuses ``float(v)``."""
    digest, total = hashlib.sha256(), 0.0
    for v in model.weights:
        array = np.asarray(v.numpy())
        digest.update(array.tobytes())
        total += float(np.sum(array, dtype=np.float64))
    return digest.hexdigest(), total


def report(history, model, after_fit):
    """Prints the script's ``CORPUS_RESULT`` line: ``history`` is what fit returned, ``model`` the trained model,
    ``after_fit`` a non-empty dict of what the script's own objects gave after fit. Returns the dict printed."""
    if not after_fit:
        raise ValueError("corpus_report: after_fit must say what the script's own objects gave after fit")
    sha, total = weights_digest(model)
    result = {
        "history": {k: plain(v[-1]) for k, v in history.history.items()},
        "history_first": {k: plain(v[0]) for k, v in history.history.items()},
        "epochs": len(history.epoch),
        "weights_sha256": sha,
        "weights_sum": total if math.isfinite(total) else str(total),
        "after_fit": plain(after_fit),
    }
    print(PREFIX + json.dumps(result, sort_keys=True), flush=True)
    return result
