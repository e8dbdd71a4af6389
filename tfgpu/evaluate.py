"""``python -m tfgpu.evaluate --model_dir=D [--checkpoint=PATH] [--data=DIR|NAME] [train flags]``.

Evaluates the latest (or a given) checkpoint of a run on its eval split, under
any strategy, with the run's own config (``D/config.yaml``); train flags given
here override it (e.g. ``--eval_split=test --cpu_logical_devices=2``). Prints
the metrics as JSON and writes them to ``D/eval-<split>-step<N>.json``. D (and
``--data``, ``--output_json``) may be local or any path TensorFlow opens (``gs://``,
``ram://``).
"""
import json
import sys

from tfgpu import cli
from tfgpu.config import ConfigError
from tfgpu.runtime import failures, fileio, process_exit, run_dir
from tfgpu.training import restore

USAGE = "python -m tfgpu.evaluate --model_dir=D [--checkpoint=PATH] [--data=DIR|NAME] [--output_json=F] [train flags]"


def parser() -> cli.ArgumentParser:
    p = restore.parser("python -m tfgpu.evaluate", USAGE, __doc__.split("\n\n")[1].replace("\n", " "), "to evaluate")
    p.add_argument("--data", default="", help="A converted dataset directory (sets --data_dir) or a dataset name "
                   "(sets --dataset) to evaluate on instead of the run's.")
    p.add_argument("--output_json", default="", help="Where to write the metrics; default "
                   "<model_dir>/eval-<split>-step<N>.json.")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(parser().format_help())
        return 0
    try:
        opts = parser().parse_args(argv)
        fileio.check_schemes({"data": opts.data, "output_json": opts.output_json})
        if opts.data:
            opts.config_flags["data_dir" if fileio.isdir(opts.data) else "dataset"] = opts.data
        config, built, step = restore.restored(opts, use="evaluate")
        if not built.info.eval_split and not built.task.evaluates_without_eval_split:
            raise ConfigError("eval_split", "the dataset has no eval split; name one with --eval_split")
        metrics = {"step": step, "split": built.info.eval_split, **built.trainer.evaluate(step, record=False)}
    except ConfigError as e:
        return failures.report(e)
    text = json.dumps(metrics, indent=2, sort_keys=True)
    print(text)
    if built.placement.is_chief:
        from tfgpu.runtime.fileio import atomic_write_bytes

        path = opts.output_json or run_dir.evaluation(config.model_dir, built.info.eval_split or "gan", step)
        atomic_write_bytes(path, text.encode())
    return 0


def run():
    """The command (``python -m tfgpu.evaluate`` and its console script): ``main``, then the process ends at once,
    not held open by TensorFlow (``process_exit``)."""
    process_exit.run_command(main)


if __name__ == "__main__":
    run()
