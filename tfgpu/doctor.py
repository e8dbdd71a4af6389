"""``python -m tfgpu.doctor [--model_dir=DIR] [--output_json=F]``: what this host offers for training, and advice.

Prints, and writes as JSON, the versions (Python, TensorFlow, Keras), how
TensorFlow was built (CUDA, cuDNN, compute capabilities), every GPU TensorFlow
sees (name, compute capability, memory, tensor-core types, NUMA node) or why
it sees none, NCCL, whether XLA compiles and runs a function on the CPU, the
CPU (model, cores, AVX2/AVX-512/BF16/AMX flags), host memory and the free disk
under ``--model_dir``. It ends with recommendations from ``recommend(report)``,
a pure function of the JSON (``tfgpu.runtime.advice``; the facts come from ``tfgpu.runtime.host``). It
needs no GPU and finishes in seconds (most of it is importing TensorFlow).
"""
import json
import os
import sys

from tfgpu import cli
from tfgpu.config import ConfigError
from tfgpu.runtime import failures
from tfgpu.runtime.advice import format_report, recommend
from tfgpu.runtime.host import collect


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = cli.ArgumentParser(prog="python -m tfgpu.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", default="", help="Where runs will write; its free disk is reported "
                        "(default: the current directory).")
    parser.add_argument("--output_json", default="", help="Also write the report as JSON here.")
    if cli.wants_help(argv):
        print(parser.format_help())
        return 0
    try:
        opts = parser.parse_args(argv)
        if opts.model_dir and os.path.exists(opts.model_dir) and not os.path.isdir(opts.model_dir):
            raise ConfigError("model_dir", f"{opts.model_dir!r} is a file, not a directory")
        if opts.output_json:
            directory = os.path.dirname(os.path.abspath(opts.output_json))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise ConfigError("output_json", f"directory {directory!r} does not exist or is not writable")
    except ConfigError as e:
        return failures.report(e)
    # TensorFlow's reasons for a missing GPU are INFO lines; they are captured, not shown.
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    report = collect(opts.model_dir)
    report["recommendations"] = recommend(report)
    print(format_report(report), flush=True)
    if opts.output_json:
        from tfgpu.runtime.fileio import atomic_write_bytes

        atomic_write_bytes(opts.output_json, (json.dumps(report, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
