"""Entrypoint: ``python -m tfgpu.train --flagfile=configs/<job>.flags --model_dir=DIR [--flag=value ...]``.

Every ``Config`` field is a flag of the same name (declared by ``tfgpu.cli`` from
``config/options.py``). Sources, lowest precedence first: field defaults, ``--config`` YAML,
flagfiles, the command line. Flagfiles may nest (a relative path inside a
flagfile is resolved against that file's directory first). Exit codes
(``tfgpu.runtime.failures.EXIT_CODES``): 0 done, 1 bad flag or input, 2 too many
non-finite steps, 3 a GPU kernel failed, 129 a worker was lost (after
``--max_restarts`` re-executions), 130 stopped by Ctrl-C and 143 by SIGTERM (each after saving a checkpoint
at the step in flight; a second Ctrl-C ends at once without saving).
"""
import time

PROCESS_STARTED = time.time()  # as early as this command can know it: --target's time_to_target_s counts from here

import os  # noqa: E402
import sys  # noqa: E402

# Before TensorFlow is imported anywhere; a level the user set also shows TensorFlow's start-up lines.
USER_TF_LOG_LEVEL = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfgpu import cli  # noqa: E402
from tfgpu.runtime import logs, process_exit  # noqa: E402
from tfgpu.runtime import failures  # noqa: E402
from tfgpu.metrics.history import PhaseTimer  # noqa: E402
from tfgpu import config as config_lib  # noqa: E402
from tfgpu import config_sources  # noqa: E402
from tfgpu.config import ConfigError  # noqa: E402

USAGE = "python -m tfgpu.train --flagfile=configs/<job>.flags --model_dir=DIR [--flag=value ...]"


def parser() -> cli.ArgumentParser:
    """Every Config field as a flag of the same name, grouped by the module that reads it, plus --config."""
    p = cli.ArgumentParser(prog="python -m tfgpu.train", usage=USAGE,
                           description="Train a model. Every flag is also a key of --config YAML files.")
    p.add_config_flags(config_file=True)
    return p


def parse(argv: list) -> config_lib.Config:
    """argv (without the program name) → validated Config; raises ConfigError naming the flag."""
    namespace = parser().parse_args(argv)
    return cli.resolve(namespace, namespace.config)


def help_text() -> str:
    return parser().format_help()


expand_flagfiles = cli.expand_flagfiles  # tools/k8s/tfjob.py inlines flagfiles with the same reader


RESTARTS_ENV = "TFGPU_RESTARTS"
RESTART_DELAY_S = 5.0


def _restart_if_allowed(max_restarts: int, argv: list) -> None:
    """Re-executes this worker (same PID, fresh TensorFlow runtime) to resume from the last checkpoint.

    A failed collective leaves TensorFlow's collective runtime unusable, so the retry replaces the process
    image instead of looping inside it. Returns only when no restart is left."""
    done = int(os.environ.get(RESTARTS_ENV, "0"))
    if done >= max_restarts:
        return
    print(f"restarting this worker ({done + 1} of --max_restarts={max_restarts}) in {RESTART_DELAY_S:.0f} s",
          file=sys.stderr, flush=True)
    import time

    time.sleep(RESTART_DELAY_S)
    os.environ[RESTARTS_ENV] = str(done + 1)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "tfgpu.train", *argv])


def main(argv=None) -> int:
    """Runs the command; with ``argv`` None (this process's command line) the run's clock starts when this
    module was imported, otherwise (a call from Python) now."""
    started_at = PROCESS_STARTED if argv is None else time.time()
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(help_text())
        return 0
    logs.setup()
    startup = PhaseTimer(started_at)
    startup.mark("imports")  # Python and tfgpu's command line
    try:
        # What needs no TensorFlow first (flags, flagfiles, recipes, YAML, types, choices, ranges): a mistake there
        # is one line in well under a second.
        namespace = parser().parse_args(argv)
        config = config_sources.check_names(cli.resolve(namespace, namespace.config, references=False))
    except ConfigError as e:
        return failures.report(e)
    try:
        # Checking what the values name imports the model registry, and with it Keras and TensorFlow: their own
        # phase of the startup record (seconds), not hidden in the check's.
        with logs.quiet_native_startup(show=USER_TF_LOG_LEVEL is not None):
            import keras  # noqa: F401
            import tensorflow as tf

            tf.config.list_physical_devices("GPU")  # CUDA's first lines (cuInit without a driver) are start-up's

        startup.mark("tensorflow_import")
        config_sources.check_references(config)
        from tfgpu.training import experiment

        startup.mark("flags")
        metrics = experiment.run(config, startup=startup)  # resolves the cluster before model_dir is touched
    except failures.WorkerLost as e:
        code = failures.report(e)
        _restart_if_allowed(config.max_restarts, argv)
        return code
    except failures.FAILURES as e:  # Interrupted (Ctrl-C while training, after its save) among them
        return failures.report(e)
    except KeyboardInterrupt:  # Ctrl-C before training started or after it ended: nothing of training is lost
        print(f"stopped: interrupted by SIGINT (Ctrl-C) outside training; {config.model_dir} keeps its latest "
              "checkpoint, if any: run the same command again to resume from it", file=sys.stderr, flush=True)
        return failures.INTERRUPTED
    from tfgpu.metrics import results

    print("final: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in results.console_values(metrics).items()), flush=True)
    return failures.OK


def run():
    """The command (``python -m tfgpu.train`` and its console script): ``main``, then the process ends at once,
    not held open by TensorFlow (``process_exit``)."""
    process_exit.run_command(main)


if __name__ == "__main__":
    run()
