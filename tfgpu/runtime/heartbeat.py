"""A worker's progress as ``tfgpu.launch`` sees it: one small JSON file per worker, replaced after every loop.

The launcher names the file in ``TFGPU_HEARTBEAT_FILE``; the trainer calls ``beat`` when its checkpoint is
restored (``phase: restored``), after every loop of --steps_per_loop steps (``training``) and when training
is done (``done``: what is left, the export and the report, needs no peer). A worker whose file stops changing
is making no progress, whatever its process state: a worker blocked in a collective whose peer is gone looks
alive to ``ps``. Without the variable (a run not started by the launcher) ``beat`` does nothing. No TensorFlow.
"""
import json
import os
import time

ENV = "TFGPU_HEARTBEAT_FILE"
PHASES = ("restored", "training", "done")


def beat(phase: str, step: int, model_dir: str = "", environ=None) -> None:
    """Replaces this worker's heartbeat file (atomically: the launcher never reads half a file); no-op when the
    launcher did not ask for one. A file that cannot be written is not a reason to stop training."""
    path = (os.environ if environ is None else environ).get(ENV, "")
    if not path:
        return
    record = {"phase": phase, "step": int(step), "time": round(time.time(), 3), "pid": os.getpid(),
              "model_dir": model_dir}
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as f:
            f.write(json.dumps(record))
        os.replace(temporary, path)
    except OSError:
        pass


def read(path: str):
    """The last heartbeat written to ``path`` as a dict, or None when there is none yet (or it does not parse)."""
    try:
        with open(path) as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("phase") in PHASES else None
