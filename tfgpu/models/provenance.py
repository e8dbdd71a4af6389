"""Which code built a run's models: ``model_source.json`` names each user builder's module, file and sha256.

Its own module because it needs both the registry (a registered name is never a user builder) and
``tfgpu.models.user``, which the registry itself imports to load a user's builder.
"""
import hashlib
import json
import logging
import os

from tfgpu.models import user
from tfgpu.models.registry import is_registered

log = logging.getLogger("tfgpu")


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_record(config) -> dict:
    """For each of --model, --generator, --discriminator that names a user builder: the reference, the module's
    name, its absolute file and that file's sha256 (what code built the run)."""
    record = {}
    for flag in user.FLAGS:
        reference = getattr(config, flag)
        if not reference or is_registered(reference) or not user.is_reference(reference):
            continue
        builder = user.load(reference, flag)
        record[flag] = {"reference": reference, "module": builder.module.__name__, "file": builder.file,
                        "sha256": _sha256(builder.file) if builder.file else ""}
    return record


def write_source_record(config, model_dir: str) -> None:
    """Writes ``model_dir/model_source.json`` when the run uses a user builder (nothing otherwise)."""
    from tfgpu.runtime.fileio import atomic_write_bytes

    record = source_record(config)
    if record:
        atomic_write_bytes(os.path.join(model_dir, user.SOURCE_FILE), json.dumps(record, indent=2).encode())


def warn_if_changed(config, model_dir: str) -> None:
    """Logs a warning for each user file whose content differs from the one the run recorded (a rebuilt model,
    e.g. for evaluate or export, may then not match its checkpoint)."""
    path = os.path.join(model_dir, user.SOURCE_FILE)
    from tfgpu.runtime import fileio

    if not fileio.isfile(path):
        return
    recorded = json.loads(fileio.read_text(path))
    for flag, now in source_record(config).items():
        then = recorded.get(flag, {})
        if then.get("sha256") and now["sha256"] and then["sha256"] != now["sha256"]:
            log.warning("--%s: %s changed since this run recorded it in %s (sha256 %s..., now %s...); the model "
                        "it builds may not match the checkpoint", flag, now["file"], path, then["sha256"][:12],
                        now["sha256"][:12])
