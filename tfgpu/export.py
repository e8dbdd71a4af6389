"""``python -m tfgpu.export --model_dir=D [--format=keras|saved_model] [--output=PATH] [--checkpoint=PATH]``.

Rebuilds the run's model, restores the latest (or a given) checkpoint and saves
it in a form that loads without tfgpu: a ``.keras`` file (``keras.saving.load_model``)
or a TensorFlow SavedModel with a ``serve`` signature (``tf.saved_model.load``,
TF Serving). A classifier takes float32 NHWC images in the run's --input_range
(default -1,1) and returns float32 logits, whatever precision the run trained
in; a GAN's generator returns float32 images in [-1, 1]. Beside the model,
``<name>.input.json`` states its input (shape, dtype, range, how to scale uint8
pixels) and output, and the command's last line repeats the range.
"""
import json
import os
import sys

from tfgpu import cli
from tfgpu.config import ConfigError
from tfgpu.evaluate import restore, run_config, run_parser

USAGE = ("python -m tfgpu.export --model_dir=D [--format=keras|saved_model] [--output=PATH] [--checkpoint=PATH] "
         "[train flags]")
FORMATS = ("keras", "saved_model")


def parser() -> cli.ArgumentParser:
    p = run_parser("python -m tfgpu.export", USAGE, " ".join(__doc__.split("\n\n")[1].split()), "to export")
    p.add_argument("--format", default="keras", choices=FORMATS, help="keras: one .keras file; saved_model: a "
                   "TensorFlow SavedModel directory with a serve signature.")
    p.add_argument("--output", default="", help="Where to write; default <model_dir>/export/model.keras or "
                   "<model_dir>/export/saved_model.")
    return p


def description_path(output: str) -> str:
    """Where the description of an export at ``output`` goes: ``export/model.keras`` -> ``export/model.input.json``,
    ``export/saved_model`` -> ``export/saved_model.input.json``."""
    stem = output.rstrip("/")
    return (stem[:-len(".keras")] if stem.endswith(".keras") else stem) + ".input.json"


def describe(config, info) -> dict:
    """What an exported model takes and returns, for its user (the run's --input_range for a classifier)."""
    h, w, c = info.image_shape
    images = {"dtype": "float32", "layout": "NHWC", "shape": [None, h, w, c]}
    if config.task == "gan":
        inputs = {"latent": {"dtype": "float32", "shape": [None, config.latent_dim]}}
        if config.conditional:
            inputs["label"] = {"dtype": "int64", "shape": [None]}
        return {"task": "gan", "model": config.model, "input": inputs,
                "output": {**images, "range": [-1.0, 1.0], "meaning": "generated images"},
                "classes": list(info.classes)}
    low, high = (float(v) for v in config.input_range)
    return {"task": config.task, "model": config.model,
            "input": {**images, "range": [low, high],
                      "from_uint8": f"pixels 0..255 map linearly to {low:g}..{high:g}: "
                                    f"x / 255 * ({high:g} - {low:g}) + {low:g}"},
            "output": {"dtype": "float32", "shape": [None, info.num_classes], "meaning": "logits, one per class"},
            "classes": list(info.classes)}


def summary(description: dict) -> str:
    """One line for the log: what the exported model takes."""
    if description["task"] == "gan":
        return "outputs float32 images in [-1, 1]"
    low, high = description["input"]["range"]
    return f"input: float32 NHWC images in [{low:g}, {high:g}] (--input_range)"


def write_description(config, info, output: str) -> str:
    """Writes ``description_path(output)`` (atomically) and returns its path."""
    from tfgpu.runtime.fileio import atomic_write_bytes

    path = description_path(output)
    atomic_write_bytes(path, (json.dumps(describe(config, info), indent=2) + "\n").encode())
    return path


def save(task, fmt: str, output: str) -> None:
    """Writes what the task deploys (a GAN: its EMA generator) as a .keras file or a SavedModel directory."""
    from tfgpu.training import experiment

    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if fmt == "keras":
        experiment.export_model(task, output)
        return
    import shutil

    tmp = output.rstrip("/") + f".tmp-{os.getpid()}"
    task.model.export(tmp, format="tf_saved_model", verbose=False)
    if os.path.exists(output):
        shutil.rmtree(output)
    os.replace(tmp, output)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(parser().format_help())
        return 0
    try:
        opts = parser().parse_args(argv)
        output = opts.output or os.path.join(
            opts.model_dir, "export", "model.keras" if opts.format == "keras" else "saved_model")
        if opts.format == "keras" and not output.endswith(".keras"):
            raise ConfigError("output", f"{output!r}: a Keras model file must end in .keras")
        config = run_config(opts.model_dir, opts)
        built, step = restore(config, opts.checkpoint)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    save(built.task, opts.format, output)
    path = write_description(config, built.info, output)
    print(f"exported step {step} to {output}; {summary(describe(config, built.info))}, described in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
