"""``python -m tfgpu.convert``: turn labelled images (every kind --source takes) into TFRecords and dataset.json.

    python -m tfgpu.convert --source=/data/imagenet --output_dir=/data/imagenet-tfr --workers=16
    python -m tfgpu.convert --source=labels.csv --output_dir=out --split=train:0.9,val:0.1 --seed=1
    python -m tfgpu.convert --source=tfds:cifar10 --tfds_data_dir=~/tensorflow_datasets --output_dir=cifar10

Writes ``<output_dir>/<split>-SSSSS-of-NNNNN.tfrecord`` and, last, ``dataset.json``.
Rerunning the same command reuses complete, verified shards of unchanged images; a
finished dataset stays as it is until its replacement is complete. Exit code 1 with a
one-line ``error:`` naming the flag (or the bad image's or folder's path) on bad input.
"""
import os
import sys

from tfgpu import cli
from tfgpu.data.sources import source_formats
from tfgpu.runtime import logs

USAGE = "python -m tfgpu.convert --source=SRC --output_dir=DIR [options]"


def build_parser() -> cli.ArgumentParser:
    p = cli.ArgumentParser(prog="python -m tfgpu.convert", usage=USAGE, description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--source", default="", help=source_formats.help_text())
    a("--output_dir", default="", help="Where the shards and dataset.json go; must be empty or hold this same "
      "conversion (then complete shards are reused).")
    a("--split", default="", help="Split the examples, e.g. train:0.9,val:0.1 (stratified by class, seeded). "
      "A source that has splits already keeps them and has its 'train' split cut. Empty: the source's own splits "
      "(everything is 'train' for an unsplit source).")
    a("--seed", type=int, default=0, help="Seed for --split and for the order of examples within a split.")
    a("--image_format", default="keep", help="keep (store the source bytes untouched; PNG for arrays), png, jpeg "
      "or raw (uint8 HWC bytes).")
    a("--jpeg_quality", type=int, default=95, help="Quality for --image_format=jpeg.")
    a("--resize", default="", help="Resize before storing: the shorter side in pixels (256) or WIDTHxHEIGHT.")
    a("--num_shards", default="", help="Shards per split (N), or per split name (train:1024,val:128).")
    a("--shard_size_mb", type=float, default=0.0, help="Target shard size in MiB when --num_shards is not given "
      "(default 100).")
    a("--workers", type=int, default=0, help="Worker processes, one shard per task; 0 = one per core for "
      "datasets of 20,000+ images, else 1.")
    a("--compression", default="none", help="none or gzip.")
    a("--skip_bad", action="store_true", help="Skip unreadable or undecodable images (counted and listed in "
      "dataset.json) instead of stopping at the first one.")
    a("--overwrite", action="store_true", help="Replace the dataset (or other conversion) in --output_dir.")
    a("--image_key", default="image/encoded", help="tfrecord: sources: the feature holding the encoded image.")
    a("--label_key", default="image/class/label", help="tfrecord: sources: the int64 feature holding the label.")
    a("--label_offset", type=int, default=0, help="tfrecord: sources: added to every label so labels are class "
      "indices from 0 (-1 for 1-based labels, as Model Garden's ImageNet records have).")
    a("--tfds_data_dir", default="", help="tensorflow_datasets data dir for tfds: sources.")
    a("--download", action="store_true", help="Let tensorflow_datasets download and prepare a tfds: source "
      "that is not prepared in --tfds_data_dir (otherwise the converter never touches the network).")
    return p


def parse_args(argv=None):
    """argv (without the program name) -> tfgpu.data.conversion.convert.Options; raises ConfigError naming the flag."""
    from tfgpu.data.conversion.convert import Options

    args = build_parser().parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k != "config_flags"}
    values["output_dir"] = os.path.expanduser(values["output_dir"])
    values["tfds_data_dir"] = os.path.expanduser(values["tfds_data_dir"])
    if not values["source"].startswith("tfds:"):
        values["source"] = os.path.expanduser(values["source"])
    return Options(**values)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if cli.wants_help(argv):
        print(build_parser().format_help())
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logs.setup()
    from tfgpu.config import ConfigError
    from tfgpu.data.conversion import convert
    from tfgpu.runtime import failures

    try:
        convert.convert(parse_args(argv))
    except (ConfigError, convert.BadImageError, convert.WorkerDiedError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return failures.BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to finish (complete shards are kept)", file=sys.stderr)
        return failures.INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
