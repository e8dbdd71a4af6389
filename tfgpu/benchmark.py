"""Training throughput of tfgpu against plain Keras, measured in the same run.

    python -m tfgpu.benchmark --model=resnet20 --image_size=32 --batch_size=128,256 \
        --precision=float32,mixed_bfloat16 --baseline=keras_fit --output_json=bench.json

Every measurement (one runner x batch x precision x XLA setting) runs in its own
child process (``--_case=<json>``), because device settings can be applied only
once per process and peak memory is per process. The parent checks the flags,
runs the children one after another and prints a table plus the throughput
ratios of tfgpu to each baseline.

Runners: ``tfgpu`` (the Trainer: ``--steps_per_loop`` steps per tf.function
call, under ``--distribution_strategy``), ``keras_fit`` (what users write:
``model.compile(SGD, sparse CE); model.fit(...)`` on one device, same model,
data, global batch, precision and XLA setting, ``steps_per_execution=1``),
``keras_fit_spe`` (the same with ``steps_per_execution`` equal to tfgpu's
``--steps_per_loop``: the same steps per host call) and ``keras_fit_strategy``
(Keras ``fit`` under the same strategy, ``steps_per_execution=1`` because larger
values fail under MirroredStrategy; a failure is recorded, not raised).

Fair ratios: tfgpu/BASELINE is only taken between runs on the same devices; when
tfgpu's strategy uses more devices than the one-device baselines, each round also
runs tfgpu on one device (``tfgpu_one_device``) for that ratio, and the
all-device run gives the scaling ratio. Each ratio is printed with its min-max
over the paired repeats. The JSON and the table state each side's XLA scope
(tfgpu compiles the gradient step, Keras ``fit`` the whole train step) and how
batches reach the device (``--keras_one_device_strategy``).

Timing: ``--untimed_steps`` (tracing, compilation, autotuning) are excluded, then
``--windows`` windows of ``--steps_per_window`` steps are timed by wall clock,
host work between loops included; examples/sec is their median, with min/max
and quartiles as the spread.

Model, data, precision and strategy flags are tfgpu.train's own (declared once, in
``tfgpu.cli``); ``--precision`` and ``--jit_compile`` take comma-separated lists here.
The library is ``tfgpu.bench``; this module parses flags and runs it.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

from tfgpu import cli  # noqa: E402
from tfgpu.config import PRECISIONS, ConfigError  # noqa: E402
from tfgpu.runtime import failures  # noqa: E402
from tfgpu.runtime import process_exit  # noqa: E402

USAGE = ("python -m tfgpu.benchmark --model=NAME [--image_size=N] [--batch_size=B,...|auto] [--precision=P,...] "
         "[--jit_compile=false,true] [--baseline=keras_fit,...] [--output_json=F] [train flags for model, data, "
         "strategy]")
# The shared Config flags a benchmark takes: everything that shapes one training step of a classifier.
SHARED_GROUPS = ("model", "data", "distribute", "precision")
NOT_SHARED = ("precision", "jit_compile",  # swept: comma separated lists below
              "global_batch_size", "eval_split", "eval_batch_size",  # --batch_size; no evaluation is timed
              "cluster", "collective_timeout_s", "max_restarts")  # one process per measurement
DEFAULTS = {"model": "resnet20", "dataset": "synthetic", "steps_per_loop": 10}
RENAMED = {"warmup_steps": "renamed --untimed_steps (steps before timing); --warmup_steps is tfgpu.train's "
                           "learning-rate warmup"}


def _bool(text: str) -> bool:
    table = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
    if text.lower() not in table:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return table[text.lower()]


class _Renamed(argparse.Action):
    """A flag that was renamed: a one-line error pointing to the new name."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise ConfigError(self.dest, RENAMED[self.dest])


def parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m tfgpu.benchmark", usage=USAGE, description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--batch_size", default="128", help="Global batch sizes, comma separated, or 'auto': the largest "
      "per-replica batch that fits (binary search with real steps) and the table below it.")
    a("--max_batch_size", type=int, default=0, help="auto: largest per-replica batch to try; "
      "0 = until out of memory on GPU, 256 on CPU.")
    a("--batch_granularity", type=int, default=8, help="auto: per-replica batches are multiples of this.")
    a("--precision", default="float32", help=f"Comma separated: {', '.join(PRECISIONS)}, or auto (the policy "
      "tfgpu.train's --precision=auto picks on this host: bf16 on AMX CPUs and compute capability "
      ">= 8.0, fp16 on 7.x, else float32).")
    a("--jit_compile", default="false", nargs="?", const="true", help="XLA: true, false or 'false,true'.")
    a("--baseline", default="keras_fit,keras_fit_spe,keras_fit_strategy", help="Comma separated from keras_fit "
      "(steps_per_execution=1, as users write it), keras_fit_spe (steps_per_execution = --steps_per_loop), "
      "keras_fit_strategy, synthetic (tfgpu on synthetic data of the real data's shape: the input pipeline's "
      "cost), or none.")
    a("--untimed_steps", type=int, default=20, help="Steps run before timing starts (tracing, XLA compilation, "
      "autotuning).")
    for old in RENAMED:
        a(f"--{old}", action=_Renamed, nargs="?", help=argparse.SUPPRESS)
    a("--steps_per_window", type=int, default=20, help="Steps per timed window.")
    a("--windows", type=int, default=5, help="Timed windows; examples/sec is their median.")
    a("--repeats", type=int, default=1, help="Run every measurement this many times, runners alternating, and "
      "pool their windows (steadier numbers on a busy machine).")
    a("--keras_steps_per_execution", type=int, default=1, help="keras_fit: steps_per_execution "
      "(1 is what users write; keras_fit_spe uses --steps_per_loop, keras_fit_strategy always 1).")
    a("--keras_one_device_strategy", type=_bool, default=False, nargs="?", const=True, help="keras_fit and "
      "keras_fit_spe compile and fit under tf.distribute.OneDeviceStrategy on their device, so batches are "
      "prefetched to the GPU as tfgpu's are; off = what users write (without a strategy, fit copies each batch "
      "to the GPU inside the step). No difference on a CPU.")
    a("--case_timeout_s", type=float, default=1800, help="Kill a measurement that takes longer.")
    a("--output_json", default="", help="Write results and ratios here.")
    a("--_case", default="", help=argparse.SUPPRESS)
    p.add_config_flags(groups=SHARED_GROUPS, names=("seed", "steps_per_loop"), exclude=NOT_SHARED,
                       defaults=DEFAULTS, helps={
                           "image_size": "Image size; 0 = the model's default (synthetic data) or the dataset's.",
                           "dataset": "synthetic (one random batch repeated), a built-in dataset or tfds:NAME; "
                                      "ignored when --data_dir is set.",
                           "steps_per_loop": "tfgpu: steps per tf.function call."})
    return p


def _run_case(spec: str) -> int:
    """Child side: one measurement, its result written as JSON where the parent reads it."""
    from tfgpu.bench import case
    from tfgpu.runtime.fileio import atomic_write_bytes

    spec = json.loads(spec)
    atomic_write_bytes(spec["result"], json.dumps(case.run_case(spec)).encode())
    return 0


def from_recipe(argv: list, declared: set) -> list:
    """``argv`` with ``--recipe=NAME`` replaced by what a benchmark measures of that training recipe: its model,
    data, precision and strategy flags, and its --global_batch_size as --batch_size; its schedule (epochs,
    learning rate, evaluation, ...) does not apply to a benchmark and is named in one line. The command line
    wins over the recipe."""
    kept, unused, rest = [], [], []
    for arg in argv:
        if not arg.startswith("--recipe="):
            rest.append(arg)
            continue
        for flag in cli.expand_flagfiles([arg]):
            name, _, value = flag.lstrip("-").partition("=")
            if name == "global_batch_size":
                kept.append(f"--batch_size={value}")
            elif name in declared:
                kept.append(flag)
            else:
                unused.append(name)
    if unused:
        print(f"benchmark: the recipe's schedule and outputs do not apply to a benchmark: "
              f"{', '.join(sorted(set(unused)))}", file=sys.stderr)
    return kept + rest


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(parser().format_help())
        return 0
    try:
        p = parser()
        argv = from_recipe(argv, {a.dest for a in p._actions})
        opts = p.parse_args(argv)
        if opts._case:
            return _run_case(opts._case)
        opts.command = argv
        from tfgpu.bench import plan, runner

        measured = plan.plan(opts, p.config_values(opts))
        if opts.output_json:  # an unwritable output path fails now, not after the measurements
            directory = os.path.dirname(os.path.abspath(opts.output_json))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise ConfigError("output_json", f"directory {directory!r} does not exist or is not writable")
        report = runner.run_benchmark(measured)
    except ConfigError as e:
        return failures.report(e)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return failures.CHECK_FAILED
    from tfgpu.bench.report import format_report

    print(format_report(report), flush=True)
    if opts.output_json:
        from tfgpu.runtime.fileio import atomic_write_bytes

        atomic_write_bytes(opts.output_json, (json.dumps(report, indent=2) + "\n").encode())
    failed = [r for r in report["results"] if r["name"] == "tfgpu" and r["status"] != "ok"]
    return failures.CHECK_FAILED if failed else failures.OK


def run():
    """The command (``python -m tfgpu.benchmark`` and its console script): ``main``, then the process ends at once,
    not held open by TensorFlow (``process_exit``)."""
    process_exit.run_command(main)


if __name__ == "__main__":
    run()
