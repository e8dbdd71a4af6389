"""Plain Keras ``fit`` to a target, as a user writes it: the other side of tools/time_to_target.py.

    python tools/keras_fit_to_target.py --target=val_accuracy:0.97 [--dataset=digits] [--batch_size=128]
        [--learning_rate=0.1] [--epochs=30] [--label_smoothing=0] [--jit_compile=auto] [--weight_decay=0]
        [--warmup_epochs=0] [--precision=float32] [--output_json=F]

A tfgpu built-in dataset (``--dataset``: the quickstart's ``digits``, or ``mnist5k``; the same images and
train/val split that tfgpu converts, pixels scaled to -1..1 as tfgpu feeds them) as numpy arrays, the
registry's ResNet-20, float32 (``--precision``), SGD with momentum 0.9 and a cosine learning-rate decay over
``--epochs``, ``model.fit`` with validation every epoch.
A callback stops at the end of the first epoch whose validation metric reaches the target. Nothing else:
no weight decay, warmup, strategy or XLA flag (``fit``'s own ``jit_compile="auto"``, off on a CPU).
``--label_smoothing`` (default 0, as users write it) gives ``fit`` the quickstart recipe's smoothing, and
``--jit_compile=true`` XLA over its whole train step, ``--weight_decay`` tfgpu's L2 (kernels only: each one's
gradient gains ``weight_decay * w``), ``--warmup_epochs`` a linear warmup (Keras's own ``CosineDecay``
warmup) and ``--precision=mixed_bfloat16`` Keras's dtype policy (``mixed_float16`` also gets Keras's loss scaling,
which ``compile`` adds by itself), so a race can give ``fit`` tfgpu's whole recipe and tell the recipe's gain from
the loop's (Keras smooths only one-hot targets: labels become one-hot).

``time_to_target_s`` counts from this script's first line, as tfgpu.train's counts from its own, so the
imports, the data and the model build are in it on both sides. One JSON line goes to stdout (and to
``--output_json``): target, target_reached, time_to_target_s, epochs_at_target, the best value, the settings.
"""
import time

STARTED = time.time()  # the same start as tfgpu.train's PROCESS_STARTED: imports and setup count

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tfgpu from this checkout


def parse_target(text: str) -> tuple:
    """(metric, value, lower_is_better) of METRIC:VALUE; a metric named ``*loss`` must fall, others rise."""
    metric, _, value = text.rpartition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not metric or number is None:
        raise ValueError(f"--target: expected METRIC:VALUE (e.g. val_accuracy:0.97), got {text!r}")
    if not metric.startswith("val_"):
        metric = "val_" + metric  # the validation metric, as tfgpu's --target means it
    return metric, number, metric.endswith("loss")


def with_l2(loss, kernels, weight_decay: float):
    """``loss`` plus ``0.5 * weight_decay * sum(w^2)`` over ``kernels``: each kernel's gradient gains
    ``weight_decay * w``, as tfgpu's sgd applies weight decay (Keras's SGD ``weight_decay`` is decoupled)."""
    import keras

    def regularized(y_true, y_pred):
        return loss(y_true, y_pred) + 0.5 * weight_decay * keras.ops.sum(
            keras.ops.stack([keras.ops.sum(keras.ops.square(w)) for w in kernels]))
    return regularized


# What fit is given, beyond the data and the model: (name, type, default, help). The defaults are fit as users
# write it; tools/time_to_target.py offers the same flags with a fit_ prefix and passes them through.
RECIPE_FLAGS = (
    ("batch_size", int, 128, "Examples per step."),
    ("learning_rate", float, 0.1, "Peak of the cosine decay."),
    ("epochs", int, 30, "Length of the cosine schedule; fit stops there at the latest."),
    ("label_smoothing", float, 0.0, "Cross-entropy label smoothing (0: none; the quickstart recipe's is 0.1)."),
    ("weight_decay", float, 0.0, "L2 on kernels (not BatchNorm parameters nor biases), added to the loss as "
     "tfgpu's sgd adds it (0: none; the quickstart recipe's is 5e-4)."),
    ("warmup_epochs", float, 0.0, "Linear warmup to the peak learning rate before the cosine decay (0: none; the "
     "quickstart recipe's is 1)."),
    ("jit_compile", str, "auto", "model.compile's jit_compile: auto (as users write it; Keras turns XLA off on a "
     "machine without a GPU), true or false."),
    ("precision", str, "float32", "Keras's dtype policy, set before the model is built: float32 (as users write "
     "it), mixed_bfloat16 or mixed_float16 (compile adds loss scaling)."),
)
CHOICES = {"jit_compile": ("auto", "true", "false"), "precision": ("float32", "mixed_bfloat16", "mixed_float16")}


def add_recipe_flags(p: argparse.ArgumentParser, prefix: str = "") -> None:
    for name, kind, default, text in RECIPE_FLAGS:
        p.add_argument(f"--{prefix}{name}", type=kind, default=default, choices=CHOICES.get(name),
                       help=("fit: " if prefix else "") + text)


def recipe_error(args: argparse.Namespace, prefix: str = "") -> str:
    """The first bad recipe flag as one line naming it ("" when all are good)."""
    value = {name: getattr(args, prefix + name) for name, *_ in RECIPE_FLAGS}
    rules = (("batch_size", value["batch_size"] > 0, "must be positive"),
             ("learning_rate", value["learning_rate"] > 0, "must be positive"),
             ("epochs", value["epochs"] > 0, "must be positive"),
             ("label_smoothing", 0 <= value["label_smoothing"] < 1, "must be in [0, 1)"),
             ("weight_decay", value["weight_decay"] >= 0, "must be >= 0"),
             ("warmup_epochs", 0 <= value["warmup_epochs"] < value["epochs"],
              f"must be >= 0 and less than --{prefix}epochs ({value['epochs']})"))
    for name, good, rule in rules:
        if not good:
            return f"--{prefix}{name}: {rule}, got {value[name]}"
    return ""


def recipe_args(args: argparse.Namespace, prefix: str = "") -> list:
    """The recipe flags as this script's command-line arguments."""
    return [f"--{name}={getattr(args, prefix + name)}" for name, *_ in RECIPE_FLAGS]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="METRIC:VALUE, e.g. val_accuracy:0.97")
    p.add_argument("--dataset", default="digits", help="A tfgpu built-in dataset (digits, mnist5k).")
    add_recipe_flags(p)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--output_json", default="")
    args = p.parse_args(argv)
    try:
        metric, value, lower = parse_target(args.target)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    error = recipe_error(args)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    from tfgpu.data.sources.builtin import BUILTIN, load_builtin

    if args.dataset not in BUILTIN:
        print(f"error: --dataset: {args.dataset!r} is not a built-in dataset ({', '.join(BUILTIN)})", file=sys.stderr)
        return 1

    import keras
    import numpy as np

    from tfgpu.models import create_model
    from tfgpu.tasks.optimizers import decays  # tfgpu's rule: kernels decay, BatchNorm and biases do not

    keras.utils.set_random_seed(args.seed)
    keras.mixed_precision.set_dtype_policy(args.precision)  # float32 unless told: fit as users write it
    splits = load_builtin(args.dataset)["splits"]  # tfgpu's built-in with tfgpu's split: the same images
    (x_train, y_train), (x_val, y_val) = ((x.astype(np.float32) / 127.5 - 1.0, y) for x, y in
                                          (splits["train"], splits["val"]))
    model = create_model("resnet20", x_train.shape[1:], 10)
    steps_per_epoch = -(-len(x_train) // args.batch_size)
    warmup_steps = int(round(args.warmup_epochs * steps_per_epoch))
    schedule = (keras.optimizers.schedules.CosineDecay(args.learning_rate, args.epochs * steps_per_epoch)
                if not warmup_steps else
                keras.optimizers.schedules.CosineDecay(0.0, args.epochs * steps_per_epoch - warmup_steps,
                                                       warmup_target=args.learning_rate, warmup_steps=warmup_steps))
    if args.label_smoothing:  # Keras smooths one-hot targets only
        y_train, y_val = (keras.utils.to_categorical(y, 10) for y in (y_train, y_val))
        loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing)
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if args.weight_decay:
        loss = with_l2(loss, [w for w in model.trainable_weights if decays(w)], args.weight_decay)
    jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9), loss=loss, metrics=["accuracy"],
                  jit_compile=jit_compile)
    outcome = {"target": f"{metric}:{value:g}", "target_reached": False, "time_to_target_s": None,
               "epochs_at_target": None, "best": None}

    class StopAtTarget(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen = (logs or {}).get(metric)
            if seen is None:
                return
            best = outcome["best"]
            outcome["best"] = seen if best is None else (min(best, seen) if lower else max(best, seen))
            if (seen <= value) if lower else (seen >= value):
                outcome.update(target_reached=True, time_to_target_s=round(time.time() - STARTED, 1),
                               epochs_at_target=epoch + 1)
                self.model.stop_training = True

    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, validation_data=(x_val, y_val),
              callbacks=[StopAtTarget()], verbose=2)
    outcome.update(process_s=round(time.time() - STARTED, 1), dataset=args.dataset, batch_size=args.batch_size,
                   learning_rate=args.learning_rate, epochs=args.epochs, label_smoothing=args.label_smoothing,
                   jit_compile=args.jit_compile, weight_decay=args.weight_decay,
                   warmup_epochs=args.warmup_epochs, precision=model.dtype_policy.name,  # the policy fit trained in
                   train_examples=len(x_train), val_examples=len(x_val))
    line = json.dumps(outcome)
    print(line, flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
