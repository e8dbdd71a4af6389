"""What tfgpu's loop costs per step against Keras' own: ``model.fit``, ``tfgpu.fit`` and ``python -m tfgpu.train``
at the same steps per host call, on a tiny MLP and a small CNN, measured in one run (issue 46, item 6).

    python tools/bench_fit_cost.py [--rounds 3] [--steps_per_call 100] [--batch_size 64] [--epochs 4]
        [--calls_per_epoch 2] [--models tiny,cnn] [--runners keras_fit,tfgpu_fit,tfgpu_train] [--json_out F]

Runners, each run in its own process (fresh TensorFlow), interleaved over ``--rounds`` rounds (the runners' order
rotates every round):

- ``keras_fit``: ``model.compile(SGD(0.01, momentum=0.9), sparse CE from logits, metrics=["accuracy"],
  steps_per_execution=S)``; ``model.fit(x, y, batch_size=B, epochs=E, verbose=0)`` on one device, no strategy.
- ``tfgpu_fit``: the same model, compile and arrays through ``tfgpu.fit(model, x, y, batch_size=B, epochs=E,
  verbose=0, steps_per_loop=S, model_dir=...)`` (its default checkpoint cadence: one save at the end here).
- ``tfgpu_train``: ``python -m tfgpu.train --model=<file>.py:build_<model> --dataset=digits
  --global_batch_size=B --steps_per_loop=S --train_steps=E*C*S --optimizer=sgd --lr_schedule=constant`` (lr 0.01,
  momentum 0.9),
  run as ``python -m`` runs it (``runpy``) with ``heartbeat.beat``, which the trainer calls after every loop,
  wrapped to note the times. It cannot take the arrays: it reads the built-in digits from TFRecords (1,438 train
  images, the same 8x8 images the arrays tile), held decoded in memory after the first pass as its pipeline does
  for data of this size (``data.input.memory``), so it measures the same model and steps per call fed by its own
  pipeline; its default checkpoint cadence (every 1,000 steps) applies.

The arrays are the built-in digits' train split (8x8x1, scaled to -1..1 as tfgpu.train feeds them) tiled to
``C * S * B`` examples: every epoch is C calls of S steps. Inside each process, after every host call (a Keras
callback's ``on_train_batch_end``; tfgpu.train's heartbeat) the wall clock (``time.perf_counter``) and the
process's CPU time (``time.process_time``) are noted. Per run:

- ``ms_per_step``: steady state, (last call's end - first call's end) / steps in between: everything after the
  first call (tracing) counts, epoch ends and host work between calls included;
- ``cpu_ms_per_step``: the process's CPU time over the same window / steps (all threads: 2 cores can give > wall);
- ``startup_s``: from the parent's launch of the process to the end of the first call of S steps (imports,
  TensorFlow, data, build, tracing and the first S steps).

Prints one JSON line per run, then per model a table of the medians over rounds with ratios against keras_fit
(ratio of the medians; the per-round paired ratios' min-max beside it) and the issue's bound: PASS when a
runner's median ms per step is at most max(1.05 x keras_fit's, keras_fit's + 0.1 ms) and its median start-up at
most keras_fit's + 1 s, else FAIL. Exit 0 when every run measured (whatever the verdict), 1 when a run failed.
Numbers depend on the machine's load: quote ``uptime`` with them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNNERS = ("keras_fit", "tfgpu_fit", "tfgpu_train")
MODELS = ("tiny", "cnn")
BASELINE = "keras_fit"
REL_BOUND, ABS_BOUND_MS, STARTUP_BOUND_S = 0.05, 0.1, 1.0
LEARNING_RATE = 0.01  # tfgpu.train's --base_learning_rate is per 256 examples: scaled to give this

MODELS_FILE = '''"""The benchmark's models, as tfgpu.train's --model=FILE:FUNCTION takes them: logits, no softmax."""
import keras
from keras import layers


def build_tiny(input_shape, num_classes, **kwargs):
    inputs = keras.Input(input_shape)
    x = layers.Flatten()(inputs)
    x = layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="tiny_mlp")


def build_cnn(input_shape, num_classes, **kwargs):
    inputs = keras.Input(input_shape)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="small_cnn")
'''


# -- child side ---------------------------------------------------------------------------------------------------
def _window(marks, steps_per_call: int, launched_at: float) -> dict:
    """A run's figures from its marks: ``(steps so far, perf_counter, process_time, time.time)`` after every call."""
    if len(marks) < 2:
        raise RuntimeError(f"{len(marks)} host call(s) noted: need at least 2 (raise --epochs or --calls_per_epoch)")
    first, last = marks[0], marks[-1]
    steps = last[0] - first[0]
    return {"ms_per_step": round(1000 * (last[1] - first[1]) / steps, 4),
            "cpu_ms_per_step": round(1000 * (last[2] - first[2]) / steps, 4),
            "startup_s": round(first[3] - launched_at, 3), "first_call_steps": first[0], "steps_timed": steps,
            "calls": len(marks)}


def _digits_arrays(total: int):
    """The built-in digits' train split scaled to -1..1 (tfgpu.train's default --input_range), tiled to ``total``."""
    import numpy as np

    from tfgpu.data.sources import builtin

    images, labels = builtin.load_builtin("digits")["splits"]["train"]
    images = images.astype("float32") / 127.5 - 1.0
    reps = -(-total // len(images))
    return np.tile(images, (reps, 1, 1, 1))[:total], np.tile(labels, reps)[:total].astype("int64")


def _child_fit(spec: dict) -> dict:
    import importlib.util

    import keras

    if spec["runner"] == "tfgpu_fit":
        import tfgpu  # first, as a tfgpu.fit script does

    steps_per_call, batch = spec["steps_per_call"], spec["batch_size"]
    x, y = _digits_arrays(spec["calls_per_epoch"] * steps_per_call * batch)
    module_spec = importlib.util.spec_from_file_location("bench_models", spec["models_file"])
    models = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(models)
    keras.utils.set_random_seed(1)
    model = getattr(models, f"build_{spec['model']}")(x.shape[1:], 10)
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  steps_per_execution=steps_per_call)
    marks = []

    class Marks(keras.callbacks.Callback):
        """Notes the time after every host call (Keras calls on_train_batch_end once per call)."""

        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += steps_per_call
            marks.append((self.steps, time.perf_counter(), time.process_time(), time.time()))

    common = dict(batch_size=batch, epochs=spec["epochs"], verbose=0, callbacks=[Marks()])
    if spec["runner"] == "keras_fit":
        model.fit(x, y, **common)
    else:
        tfgpu.fit(model, x, y, steps_per_loop=steps_per_call, model_dir=spec["model_dir"], **common)
    return _window(marks, steps_per_call, spec["launched_at"])


def _child_train(spec: dict) -> dict:
    """``python -m tfgpu.train`` as ``-m`` runs it, its heartbeat (one call after every loop) noting the times."""
    import runpy

    from tfgpu.runtime import heartbeat

    marks, result = [], {}
    beat = heartbeat.beat

    def noting(phase, step, *args, **kwargs):
        if phase == "training":
            marks.append((int(step), time.perf_counter(), time.process_time(), time.time()))
        elif phase == "done":  # the command ends the process with os._exit: report now
            result.update(_window(marks, spec["steps_per_call"], spec["launched_at"]))
            _write(spec["result"], result)
        return beat(phase, step, *args, **kwargs)

    heartbeat.beat = noting
    total = spec["epochs"] * spec["calls_per_epoch"] * spec["steps_per_call"]
    sys.argv = ["tfgpu.train", "--dataset=digits", f"--model={spec['models_file']}:build_{spec['model']}",
                f"--global_batch_size={spec['batch_size']}", f"--steps_per_loop={spec['steps_per_call']}",
                f"--train_steps={total}", "--optimizer=sgd", "--momentum=0.9",
                f"--base_learning_rate={LEARNING_RATE * 256 / spec['batch_size']:g}", "--lr_schedule=constant",
                "--eval_split=none", "--verbose=0",
                "--seed=1", f"--model_dir={spec['model_dir']}"]
    runpy.run_module("tfgpu.train", run_name="__main__", alter_sys=True)
    return result


def _write(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def child(spec: dict) -> None:
    if spec["runner"] == "tfgpu_train":
        _child_train(spec)  # writes its result itself (the command's process ends in os._exit)
    else:
        _write(spec["result"], _child_fit(spec))


# -- parent side --------------------------------------------------------------------------------------------------
def measure(runner: str, model: str, options, root: str, tag: str) -> dict:
    """One run of ``runner`` on ``model`` in a new process: its figures (``_window``)."""
    result = os.path.join(root, f"{tag}.json")
    spec = dict(runner=runner, model=model, steps_per_call=options.steps_per_call, batch_size=options.batch_size,
                epochs=options.epochs, calls_per_epoch=options.calls_per_epoch,
                models_file=os.path.join(root, "bench_models.py"), model_dir=os.path.join(root, tag), result=result)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TFGPU_HEARTBEAT_FILE", None)
    spec["launched_at"] = time.time()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=options.timeout_s, env=env)
    if proc.returncode or not os.path.exists(result):
        raise RuntimeError(f"{runner} on {model} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    with open(result) as f:
        return json.load(f)


def _median(values):
    return statistics.median(values) if values else None


def summarize(runs: list) -> dict:
    """Per model and runner: the medians over rounds, and for each runner but keras_fit its ratios against
    keras_fit's medians (and the per-round paired ratios' range) and the issue's verdict."""
    summary = {}
    for model in sorted({r["model"] for r in runs}, key=lambda m: (MODELS + (m,)).index(m)):
        rows = {}
        for runner in [r for r in RUNNERS if any(x["runner"] == r and x["model"] == model for x in runs)]:
            mine = [r for r in runs if r["runner"] == runner and r["model"] == model]
            rows[runner] = {key: round(_median([r[key] for r in mine]), 4)
                            for key in ("ms_per_step", "cpu_ms_per_step", "startup_s")}
            rows[runner]["rounds"] = len(mine)
        base = rows.get(BASELINE)
        for runner, row in rows.items():
            if runner == BASELINE or base is None:
                continue
            row["ratio"] = round(row["ms_per_step"] / base["ms_per_step"], 3)
            row["cpu_ratio"] = round(row["cpu_ms_per_step"] / base["cpu_ms_per_step"], 3)
            row["extra_ms_per_step"] = round(row["ms_per_step"] - base["ms_per_step"], 4)
            row["extra_startup_s"] = round(row["startup_s"] - base["startup_s"], 3)
            paired = [mine["ms_per_step"] / theirs["ms_per_step"]
                      for mine in runs if mine["runner"] == runner and mine["model"] == model
                      for theirs in runs if theirs["runner"] == BASELINE and theirs["model"] == model
                      and theirs["round"] == mine["round"]]
            if paired:
                row["paired_ratio_range"] = [round(min(paired), 3), round(max(paired), 3)]
            allowed = max(REL_BOUND * base["ms_per_step"], ABS_BOUND_MS)
            row["step_ok"] = row["extra_ms_per_step"] <= allowed
            row["startup_ok"] = row["extra_startup_s"] <= STARTUP_BOUND_S
            row["verdict"] = "PASS" if row["step_ok"] and row["startup_ok"] else "FAIL"
        summary[model] = rows
    return summary


def table(summary: dict) -> str:
    lines = []
    for model, rows in summary.items():
        lines += [f"{model}:", "| runner | ms/step | vs keras_fit (paired range) | CPU ms/step | CPU vs keras_fit | "
                  "start-up s | vs keras_fit | verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for runner, row in rows.items():
            if "ratio" in row:
                low, high = row.get("paired_ratio_range", [row["ratio"], row["ratio"]])
                ratio = f"{row['ratio']:.3f} ({low:.3f}-{high:.3f}), {row['extra_ms_per_step']:+.3f} ms"
                cells = [ratio, f"{row['cpu_ms_per_step']:.3f}", f"{row['cpu_ratio']:.3f}", f"{row['startup_s']:.2f}",
                         f"{row['extra_startup_s']:+.2f} s", row["verdict"]]
            else:
                cells = ["-", f"{row['cpu_ms_per_step']:.3f}", "-", f"{row['startup_s']:.2f}", "-", "baseline"]
            lines.append(f"| {runner} | {row['ms_per_step']:.3f} | " + " | ".join(cells) + " |")
    lines.append(f"bound: ms/step <= keras_fit's + max({REL_BOUND:.0%}, {ABS_BOUND_MS} ms); start-up <= keras_fit's "
                 f"+ {STARTUP_BOUND_S:g} s (medians of the rounds)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps_per_call", type=int, default=100, help="S: compile's steps_per_execution, "
                        "tfgpu.fit's steps_per_loop, tfgpu.train's --steps_per_loop")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--calls_per_epoch", type=int, default=2, help="C: the arrays hold C * S * B examples")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runners", default=",".join(RUNNERS))
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each runner first (file caches, "
                        "tfgpu.train's one-time digits conversion)")
    parser.add_argument("--timeout_s", type=float, default=900)
    parser.add_argument("--json_out", default="")
    parser.add_argument("--_child", default="", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options._child:
        child(json.loads(options._child))
        return 0
    models, runners = options.models.split(","), options.runners.split(",")
    for name, given, known in (("models", models, MODELS), ("runners", runners, RUNNERS)):
        if not given or any(g not in known for g in given):
            parser.error(f"--{name}: from {', '.join(known)}, got {','.join(given)}")
    if options.epochs * options.calls_per_epoch < 2:
        parser.error("--epochs x --calls_per_epoch must be at least 2 (the first call is not timed)")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_fit_cost-") as root:
        with open(os.path.join(root, "bench_models.py"), "w") as f:
            f.write(MODELS_FILE)
        try:
            for i in range(options.warmup):
                for runner in runners:
                    measure(runner, models[0], options, root, f"warmup{i}-{runner}")
            for round_ in range(options.rounds):
                order = runners[round_ % len(runners):] + runners[:round_ % len(runners)]
                for model in models:
                    for runner in order:
                        record = {"round": round_, "model": model, "runner": runner, "steps_per_call":
                                  options.steps_per_call, "batch_size": options.batch_size,
                                  **measure(runner, model, options, root, f"{round_}-{model}-{runner}")}
                        print(json.dumps(record), flush=True)
                        runs.append(record)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    summary = summarize(runs)
    print(table(summary), flush=True)
    print("SUMMARY " + json.dumps(summary), flush=True)
    if options.json_out:
        with open(options.json_out, "w") as f:
            json.dump({"runs": runs, "summary": summary, "argv": sys.argv[1:]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
