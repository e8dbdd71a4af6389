"""What compiled metrics cost a tfgpu.fit step: training throughput (metrics.json's examples_per_sec, the median
over loops after the first) of one small digits classifier compiled with metrics=["accuracy"] alone and with
AUC, Precision, Recall and top-k added, on 1 device and on 2 logical CPU replicas; and (``--micro``) the time one
replica step spends on the metrics' state increments alone (``fit_metrics.CompiledMetrics.increments`` + ``add``
of a batch, compiled), and one host read of the summed state (``results``), per metric set.

    python tools/fit_metrics_cost.py [--repeats 2] [--epochs 6]
    python tools/fit_metrics_cost.py --micro [--batch 64]

Prints one JSON line per run and a summary; numbers depend on the machine's load (say it when you quote them).
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile

RUN = """
import json, sys
import keras
import tfgpu
from tfgpu.data import builtin

metrics_set, replicas, epochs, model_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x, y = builtin.load_builtin("digits")["splits"]["train"]
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")])
metrics = ["accuracy"]
if metrics_set == "many":
    metrics += [keras.metrics.SparseTopKCategoricalAccuracy(k=3), "sparse_top_k_categorical_accuracy"]
one_hot = keras.utils.to_categorical(y, 10)
if metrics_set == "many_one_hot":
    metrics += [keras.metrics.AUC(), keras.metrics.Precision(), keras.metrics.Recall(), "top_k_categorical_accuracy"]
labels = one_hot if metrics_set == "many_one_hot" else y
model.compile(optimizer="adam", loss="categorical_crossentropy" if metrics_set == "many_one_hot" else
              "sparse_categorical_crossentropy", metrics=metrics)
options = dict(cpu_logical_devices=2, distribution_strategy="mirrored") if replicas == 2 else {}
history = tfgpu.fit(model, x, labels, batch_size=64, epochs=epochs, verbose=0, steps_per_loop=10, tensorboard=False,
                    model_dir=model_dir, **options)
print("RESULT " + json.dumps({"metrics": metrics_set, "replicas": replicas,
                              "examples_per_sec": history.results["examples_per_sec"]}), flush=True)
"""


def micro(batch: int, calls: int = 200, repeats: int = 5) -> None:
    """Median time of one compiled increments-and-add call and of one host read, per metric set."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    from tfgpu.training import fit_metrics

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, batch)
    predicted = tf.constant(rng.dirichlet(np.ones(10), batch).astype("float32"))
    sets = {
        "accuracy": (["accuracy"], False),
        "sparse top-k x2": (["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3),
                             "sparse_top_k_categorical_accuracy"], False),
        "AUC+Precision+Recall+top-k": (["accuracy", keras.metrics.AUC(), keras.metrics.Precision(),
                                        keras.metrics.Recall(), "top_k_categorical_accuracy"], True),
    }
    counter = tf.Variable(0.0)
    empty = tf.function(lambda: counter.assign_add(1.0))  # a compiled call that does nothing: its overhead
    empty()
    overhead = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            empty()
        counter.numpy()
        overhead.append((time.perf_counter() - start) / calls)
    print(f"an empty compiled call: {1e6 * sorted(overhead)[repeats // 2]:.0f} us (to subtract; inside the train "
          "loop's graph the increments have no call of their own)")
    for name, (identifiers, one_hot) in sets.items():
        metrics = fit_metrics.CompiledMetrics(fit_metrics.resolve(identifiers, [], one_hot, 10))
        metrics.build(tf.distribute.get_strategy())
        truth = tf.constant(np.eye(10, dtype="float32")[labels] if one_hot else labels)
        step = tf.function(lambda: metrics.add("train", metrics.increments(truth, predicted)))
        step()
        per_call, per_read = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                step()
            metrics.state["train"].numpy()
            per_call.append((time.perf_counter() - start) / calls)
            start = time.perf_counter()
            metrics.results("train")
            per_read.append(time.perf_counter() - start)
        size = int(metrics.state["train"].shape[0])
        print(f"{name}: state {size} floats, increments+add {1e6 * sorted(per_call)[repeats // 2]:.0f} us per "
              f"batch of {batch}, host read {1e3 * sorted(per_read)[repeats // 2]:.2f} ms (median of {repeats})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--micro", action="store_true")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.micro:
        micro(args.batch)
        return
    results = []
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            for replicas in (1, 2):
                for metrics_set in ("accuracy", "many", "many_one_hot"):
                    model_dir = os.path.join(root, f"{metrics_set}-{replicas}-{repeat}")
                    proc = subprocess.run([sys.executable, "-c", RUN, metrics_set, str(replicas), str(args.epochs),
                                           model_dir], capture_output=True, text=True, timeout=900)
                    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                    if proc.returncode or not lines:
                        sys.exit(f"run failed: {proc.stderr[-2000:]}")
                    result = json.loads(lines[-1][len("RESULT "):])
                    print(json.dumps(result), flush=True)
                    results.append(result)
    for replicas in (1, 2):
        row = {}
        for metrics_set in ("accuracy", "many", "many_one_hot"):
            values = sorted(r["examples_per_sec"] for r in results
                            if r["replicas"] == replicas and r["metrics"] == metrics_set)
            row[metrics_set] = round(values[len(values) // 2], 1)
        print(f"replicas={replicas} examples/s (median of {args.repeats}): {row}")


if __name__ == "__main__":
    main()
