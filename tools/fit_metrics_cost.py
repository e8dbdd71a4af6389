"""What compiled metrics cost a tfgpu.fit step: training throughput (metrics.json's examples_per_sec, the median
over loops after the first) of one small digits classifier compiled with metrics=["accuracy"] alone and with
AUC, Precision, Recall and top-k added, on 1 device and on 2 logical CPU replicas.

    python tools/fit_metrics_cost.py [--repeats 2] [--epochs 6]

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
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
