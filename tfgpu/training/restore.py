"""A finished run restored for the commands that act on one (``evaluate``, ``export``, ``sample``): their shared
flags, the run's saved config with the flags given as overrides, and its model at the latest or a given
checkpoint, with the same one-line errors in all three."""

from tfgpu import cli, config_sources
from tfgpu.config import ConfigError
from tfgpu.runtime import fileio, run_dir


def parser(prog: str, usage: str, description: str, what: str, own: tuple = ()) -> cli.ArgumentParser:
    """A parser for a command on a finished run: ``--model_dir`` and ``--checkpoint``, and every train flag except
    ``own`` (the command's options of the same name) as an override of the run's saved config."""
    p = cli.ArgumentParser(prog=prog, usage=usage, description=description)
    p.add_argument("--model_dir", required=True, help=f"The run directory (with config.yaml) {what}.")
    p.add_argument("--checkpoint", default="", help="Checkpoint path; default: the run's latest.")
    p.add_config_flags(exclude=("model_dir", *own), overrides="the run's config.yaml")
    return p


def run_config(model_dir: str, namespace):
    """The run's saved config with the train flags of ``namespace`` applied."""
    fileio.check_scheme(model_dir, "model_dir")
    saved = run_dir.config_yaml(model_dir)
    if not fileio.exists(saved):
        raise ConfigError("model_dir", f"{saved} not found: {model_dir!r} is not a tfgpu run directory")
    config = cli.resolve(namespace, saved, references=False, model_dir=model_dir)
    _refuse_code_inside(config, namespace, model_dir, saved)
    return config_sources.check_references(config)


def _refuse_code_inside(config, namespace, model_dir: str, saved: str) -> None:
    """ConfigError when config.yaml names a builder (--model, --generator, --discriminator) whose file lies inside
    the run directory and the command line did not name it too: whoever can write a run directory could have
    put both there, and importing it would run their code as this user."""
    from tfgpu.models import user

    named = config.options()
    for flag in user.FLAGS:
        reference = named.get(flag, "")
        if flag in namespace.config_flags or not reference or not user.is_reference(reference):
            continue
        inside = user.file_inside(reference, model_dir)
        if inside:
            raise ConfigError(flag, f"{saved} names {reference!r}, code inside the run directory ({inside}), "
                              f"which is not imported from there: pass --{flag}={reference} if you trust it")


def restore(config, checkpoint: str, use: str = "use"):
    """(built experiment, restored step) of a run, without rewriting its config.yaml. The models built from its
    config (an edited --model file, an override) must be those the checkpoint recorded
    (``config_change.check_same_model``; ``use`` is the command's verb in that error), else nothing is restored."""
    from tfgpu.training import checkpoint as checkpoint_lib
    from tfgpu.training import config_change, experiment

    built = experiment.setup(config, write_config=False)
    path = checkpoint or checkpoint_lib.latest(config.model_dir)
    if path:
        config_change.check_same_model(checkpoint_lib.recorded_fingerprint(path),
                                       built.trainer.checkpointer.fingerprint.current, config, path, use)
    step = built.trainer.restore(checkpoint)
    if step == 0 and not checkpoint:
        raise ConfigError("model_dir", f"no checkpoint in {config.model_dir}/checkpoints")
    return built, step


def restored(opts, task: str = "", task_name: str = "", use: str = "use"):
    """(config, built experiment, restored step) of the run ``opts`` (a ``parser`` namespace) names; ``task``,
    when given, is the task the run must have trained (``task_name`` says it in the error); ``use``: the
    command's verb, in the error for a model that is not the checkpoint's."""
    config = run_config(opts.model_dir, opts)
    if task and config.task != task:
        raise ConfigError("model_dir", f"{opts.model_dir} is a {config.task} run, not a {task_name or task} run")
    built, step = restore(config, opts.checkpoint, use)
    return config, built, step
