"""``python -m tfgpu.export --model_dir=D [--format=keras|saved_model] [--output=PATH] [--checkpoint=PATH]``.

Rebuilds the run's model, restores the latest (or a given) checkpoint and saves
it in a form that loads without tfgpu: a ``.keras`` file (``keras.saving.load_model``)
or a TensorFlow SavedModel with a ``serve`` signature (``tf.saved_model.load``,
TF Serving). A classifier takes float32 NHWC images in the run's --input_range
(default -1,1) and returns float32 logits (probabilities when the model ends in a
softmax), whatever precision the run trained in; a GAN's generator returns float32
images in [-1, 1] (unbounded when it does not end in tanh). Beside the model,
``<name>.input.json`` states its input (shape, dtype, range, how to scale uint8
pixels) and output, and the command's last line repeats the range. ``--model_dir``
and ``--output`` may be local or any path TensorFlow opens (``gs://``, ``ram://``).
"""
import sys

from tfgpu import cli
from tfgpu.config import ConfigError
from tfgpu.runtime import failures, fileio
from tfgpu.training import restore
from tfgpu.runtime import run_dir
from tfgpu.training.exporting import read_description, save, summary, write_description

USAGE = ("python -m tfgpu.export --model_dir=D [--format=keras|saved_model] [--output=PATH] [--checkpoint=PATH] "
         "[train flags]")
FORMATS = ("keras", "saved_model")


def parser() -> cli.ArgumentParser:
    p = restore.parser("python -m tfgpu.export", USAGE, " ".join(__doc__.split("\n\n")[1].split()), "to export")
    p.add_argument("--format", default="keras", choices=FORMATS, help="keras: one .keras file; saved_model: a "
                   "TensorFlow SavedModel directory with a serve signature.")
    p.add_argument("--output", default="", help="Where to write; default <model_dir>/export/model.keras or "
                   "<model_dir>/export/saved_model.")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(parser().format_help())
        return 0
    try:
        opts = parser().parse_args(argv)
        output = opts.output or (run_dir.exported_model if opts.format == "keras" else run_dir.exported_saved_model)(opts.model_dir)
        fileio.check_scheme(output, "output")
        if opts.format == "keras" and not output.endswith(".keras"):
            raise ConfigError("output", f"{output!r}: a Keras model file must end in .keras")
        config, built, step = restore.restored(opts, use="export")
    except ConfigError as e:
        return failures.report(e)
    save(built.task, opts.format, output)
    facts = built.task.model_facts()
    path = write_description(config, built.info, output, facts)
    print(f"exported step {step} to {output}; {summary(read_description(path))}, described in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
