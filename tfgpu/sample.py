"""``python -m tfgpu.sample --model_dir=D [--num=64] [--out=samples.png] [--checkpoint=PATH] [--raw] [--seed=N]``.

Renders a grid of generated images from a GAN run's latest (or a given)
checkpoint, with the EMA generator weights unless ``--raw`` asks for the
generator's own. Uses the run's saved config (``D/config.yaml``); train flags
given here override it (e.g. ``--cpu_logical_devices=0``); ``--seed`` here is the
latent seed, not the run's. ``--model_dir`` and ``--out`` may be local or any path
TensorFlow opens (``gs://``, ``ram://``).
"""
import sys

from tfgpu import cli
from tfgpu.config import ConfigError
from tfgpu.runtime import fileio
from tfgpu.tasks.gan.options import GanOptions
from tfgpu.runtime import failures
from tfgpu.training import restore
from tfgpu.runtime import run_dir

USAGE = ("python -m tfgpu.sample --model_dir=D [--num=64] [--out=PNG] [--checkpoint=PATH] [--raw] [--seed=N] "
         "[--nrow=N] [train flags]")


def parser() -> cli.ArgumentParser:
    p = restore.parser("python -m tfgpu.sample", USAGE, " ".join(__doc__.split("\n\n")[1].split()), "of the GAN",
                   own=("seed",))
    p.add_argument("--num", type=int, default=64, help="Images to generate.")
    p.add_argument("--out", default="", help="PNG path; default <model_dir>/samples/sample_step<N>.png.")
    p.add_argument("--raw", action="store_true", help="Use the generator's weights instead of their EMA.")
    p.add_argument("--seed", type=int, default=0, help="Latent seed.")
    p.add_argument("--nrow", type=int, default=0, help="Images per grid row; 0 = square.")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(parser().format_help())
        return 0
    try:
        opts = parser().parse_args(argv)
        if opts.num <= 0:
            raise ConfigError("num", f"must be positive, got {opts.num}")
        fileio.check_scheme(opts.out, "out")
        config, built, step = restore.restored(opts, task="gan", task_name="GAN", use="sample from")
        from tfgpu.tasks.gan import images

        out = opts.out or run_dir.sampled(config.model_dir, step)
        fileio.makedirs(fileio.parent(out))
        generated = built.task.sample(opts.num, ema=not opts.raw, seed=opts.seed)
        images.save_grid(generated, out, nrow=opts.nrow)
    except ConfigError as e:
        return failures.report(e)
    weights = "generator" if opts.raw or not GanOptions.of(config).ema_decay else "EMA generator"
    print(f"wrote {opts.num} images from step {step} ({weights}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
