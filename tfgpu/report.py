"""``python -m tfgpu.report --model_dir=D``: (re)write D/report.md and D/plots/*.png from what a run left.

D may be a local directory or any path TensorFlow opens (``gs://``, ``ram://``).

The report itself (what it reads, how it renders) lives in ``tfgpu.reporting.report``.
"""
import sys

from tfgpu import cli
from tfgpu.config import ConfigError
from tfgpu.runtime import failures
from tfgpu.reporting.report import write_report
from tfgpu.runtime import fileio
from tfgpu.metrics import results
from tfgpu.runtime import run_dir


def main(argv=None) -> int:
    parser = cli.ArgumentParser(prog="python -m tfgpu.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True, help="A run directory (history.jsonl, metrics.json, ...).")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = parser.parse_args(argv)
        fileio.check_scheme(opts.model_dir, "model_dir")
        if not fileio.isdir(opts.model_dir):
            raise ConfigError("model_dir", f"{opts.model_dir!r} is not a directory")
        if not any(fileio.exists(path(opts.model_dir)) for path in (run_dir.history, run_dir.config_yaml)) \
                and not fileio.exists(results.path(opts.model_dir)):
            raise ConfigError("model_dir", f"{opts.model_dir!r} has no history.jsonl, metrics.json or config.yaml: "
                              "not a tfgpu run directory")
    except ConfigError as e:
        return failures.report(e)
    path = write_report(opts.model_dir)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
