"""``python -m tfgpu.sample --model_dir=D [--num=64] [--out=samples.png] [--checkpoint=PATH] [--raw] [--seed=N]``.

Renders a grid of generated images from a GAN run's latest (or a given)
checkpoint, with the EMA generator weights unless ``--raw`` asks for the
generator's own. Uses the run's saved config (``D/config.yaml``); train flags
given here override it (e.g. ``--cpu_logical_devices=0``).
"""
import argparse
import os
import sys

from tfgpu.config import ConfigError


def _parser():
    parser = argparse.ArgumentParser(prog="python -m tfgpu.sample", description=__doc__.split("\n\n")[1])
    parser.add_argument("--model_dir", required=True, help="the GAN run directory")
    parser.add_argument("--num", type=int, default=64, help="images to generate")
    parser.add_argument("--out", default="", help="PNG path (default <model_dir>/samples/sample_step<N>.png)")
    parser.add_argument("--checkpoint", default="", help="checkpoint path (default: the latest)")
    parser.add_argument("--raw", action="store_true", help="use the generator's weights instead of their EMA")
    parser.add_argument("--seed", type=int, default=0, help="latent seed")
    parser.add_argument("--nrow", type=int, default=0, help="images per grid row (0 = square)")
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, overrides = _parser().parse_known_args(argv)
    try:
        if args.num <= 0:
            raise ConfigError("num", f"must be positive, got {args.num}")
        from tfgpu.evaluate import run_config

        config = run_config(args.model_dir, overrides)
        if config.task != "gan":
            raise ConfigError("model_dir", f"{args.model_dir} is a {config.task} run, not a GAN run")
        from tfgpu import experiment, images

        built = experiment.setup(config, write_config=False)
        step = built.trainer.restore(args.checkpoint)
        if step == 0 and not args.checkpoint:
            raise ConfigError("model_dir", f"no checkpoint in {args.model_dir}/checkpoints")
        out = args.out or os.path.join(config.model_dir, "samples", f"sample_step{step}.png")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        generated = built.task.sample(args.num, ema=not args.raw, seed=args.seed)
        images.save_grid(generated, out, nrow=args.nrow)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    weights = "generator" if args.raw or not config.ema_decay else "EMA generator"
    print(f"wrote {args.num} images from step {step} ({weights}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
