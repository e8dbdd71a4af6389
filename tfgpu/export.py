"""``python -m tfgpu.export --model_dir=D [--format=keras|saved_model] [--output=PATH] [--checkpoint=PATH]``.

Rebuilds the run's model, restores the latest (or a given) checkpoint and saves
it in a form that loads without tfgpu: a ``.keras`` file (``keras.saving.load_model``)
or a TensorFlow SavedModel with a ``serve`` signature (``tf.saved_model.load``,
TF Serving). Inputs are float32 images in [-1, 1] and outputs float32 logits,
whatever precision the run trained in.
"""
import os
import sys

from tfgpu.config import ConfigError
from tfgpu.evaluate import parse_tool_args, run_config

FORMATS = ("keras", "saved_model")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options, overrides = parse_tool_args(argv, ("model_dir", "format", "output", "checkpoint"))
        model_dir = options.get("model_dir")
        if not model_dir:
            raise ConfigError("model_dir", "is required: the directory of the run to export")
        fmt = options.get("format") or "keras"
        if fmt not in FORMATS:
            raise ConfigError("format", f"{fmt!r} is not one of {', '.join(FORMATS)}")
        output = options.get("output") or os.path.join(
            model_dir, "export", "model.keras" if fmt == "keras" else "saved_model")
        if fmt == "keras" and not output.endswith(".keras"):
            raise ConfigError("output", f"{output!r}: a Keras model file must end in .keras")
        config = run_config(model_dir, overrides)
        from tfgpu import experiment

        built = experiment.setup(config, write_config=False)
        step = built.trainer.restore(options.get("checkpoint", ""))
        if step == 0 and not options.get("checkpoint"):
            raise ConfigError("model_dir", f"no checkpoint in {model_dir}/checkpoints")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if fmt == "keras":
        experiment.export_model(built.task, output)  # what the task deploys (a GAN: its EMA generator)
    else:
        import shutil

        model = built.task.model

        tmp = output.rstrip("/") + f".tmp-{os.getpid()}"
        model.export(tmp, format="tf_saved_model", verbose=False)
        if os.path.exists(output):
            shutil.rmtree(output)
        os.replace(tmp, output)
    print(f"exported step {step} to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
