"""``python -m tfgpu.evaluate --model_dir=D [--checkpoint=PATH] [--data=DIR|NAME] [train flags]``.

Evaluates the latest (or a given) checkpoint of a run on its eval split, under
any strategy, with the run's own config (``D/config.yaml``); train flags given
here override it (e.g. ``--eval_split=test --cpu_logical_devices=2``). Prints
the metrics as JSON and writes them to ``D/eval-<split>-step<N>.json``.
"""
import json
import os
import sys

from tfgpu.config import ConfigError


def parse_tool_args(argv, own: tuple):
    """Splits ``--name=value`` args into this tool's options (``own``) and train flags for the run config."""
    options, rest = {}, []
    for arg in argv:
        name, _, value = arg.lstrip("-").partition("=")
        if arg.startswith("--") and name in own:
            options[name] = value
        else:
            rest.append(arg)
    return options, rest


def run_config(model_dir: str, overrides: list):
    """The run's saved config with ``overrides`` (train flags) applied."""
    from tfgpu import train

    saved = os.path.join(model_dir, "config.yaml")
    if not os.path.exists(saved):
        raise ConfigError("model_dir", f"{saved} not found: {model_dir!r} is not a tfgpu run directory")
    return train.parse([f"--config={saved}", f"--model_dir={model_dir}", *overrides])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options, overrides = parse_tool_args(argv, ("model_dir", "checkpoint", "data", "output_json"))
        if not options.get("model_dir"):
            raise ConfigError("model_dir", "is required: the directory of the run to evaluate")
        data = options.get("data")
        if data:
            overrides.append(f"--data_dir={data}" if os.path.isdir(data) else f"--dataset={data}")
        config = run_config(options["model_dir"], overrides)
        from tfgpu import experiment

        built = experiment.setup(config, write_config=False)
        step = built.trainer.restore(options.get("checkpoint", ""))
        if step == 0 and not options.get("checkpoint"):
            raise ConfigError("model_dir", f"no checkpoint in {options['model_dir']}/checkpoints")
        if not built.info.eval_split and config.task == "classification":
            raise ConfigError("eval_split", "the dataset has no eval split; name one with --eval_split")
        metrics = {"step": step, "split": built.info.eval_split, **built.trainer.evaluate(step, record=False)}
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if built.placement.is_chief:
        from tfgpu.fileio import atomic_write_bytes

        path = options.get("output_json") or os.path.join(
            config.model_dir, f"eval-{built.info.eval_split or 'gan'}-step{step}.json")
        atomic_write_bytes(path, text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
