"""Which code built a run's models: ``model_source.json`` names each user builder's module, file and sha256.

Its own module because it needs both the registry (a registered name is never a user builder) and
``tfgpu.models.user``, which the registry itself imports to load a user's builder.
"""
import hashlib
import json
import logging

from tfgpu.models import user
from tfgpu.models.registry import is_registered
from tfgpu.runtime import run_dir

log = logging.getLogger("tfgpu")


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_record(config) -> dict:
    """For each of --model, --generator, --discriminator that names a user builder: the reference, the module's
    name, its absolute file and that file's sha256 (what code built the run)."""
    record = {}
    named = config.options()
    for flag in user.FLAGS:
        reference = named.get(flag, "")
        if not reference or is_registered(reference) or not user.is_reference(reference):
            continue
        builder = user.load(reference, flag)
        record[flag] = {"reference": reference, "module": builder.module.__name__, "file": builder.file,
                        "sha256": _sha256(builder.file) if builder.file else ""}
    return record


def builder_sources(config) -> dict:
    """{flag: {"what", "sha256"}} of the code behind each of --model, --generator, --discriminator that is not tfgpu's
    own: a user file's sha256 (``source_record``). Part of the model fingerprint (``tfgpu.models.fingerprint``); a source that cannot be
    read is left out (the layers are still compared)."""
    sources = {flag: {"what": f"--{flag} file {entry['file'] or entry['module']}", "sha256": entry["sha256"]}
               for flag, entry in source_record(config).items() if entry["sha256"]}
    return sources


def write_source_record(config, model_dir: str) -> None:
    """Writes ``model_dir/model_source.json`` when the run uses a user builder (nothing otherwise) and the file does
    not already record the same sources: an unchanged resume leaves it as it is (a changed source reaches here only
    with --allow_config_change=model; a refused resume writes nothing)."""
    from tfgpu.runtime import fileio

    record = source_record(config)
    if not record:
        return
    path = run_dir.model_source(model_dir)
    if fileio.isfile(path):
        try:
            before = json.loads(fileio.read_text(path))
        except ValueError:
            before = None
        if isinstance(before, dict) and all(before.get(flag, {}).get("sha256") == entry["sha256"]
                                            for flag, entry in record.items()):
            return
    fileio.atomic_write_bytes(path, json.dumps(record, indent=2).encode())


def warn_if_changed(config, model_dir: str) -> None:
    """Logs a warning for each user file whose content differs from the one the run recorded (a rebuilt model,
    e.g. for evaluate or export, may then not match its checkpoint)."""
    path = run_dir.model_source(model_dir)
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


def recorded_sources(model_dir: str):
    """The sources model_source.json recorded, as a fingerprint of sources alone (``fingerprint.differences``
    compares them): what a checkpoint written before fingerprints were recorded is checked against; None without
    the file (or when it does not read)."""
    from tfgpu.runtime import fileio

    path = run_dir.model_source(model_dir)
    try:
        recorded = json.loads(fileio.read_text(path)) if fileio.isfile(path) else None
    except ValueError:
        return None
    if not isinstance(recorded, dict):
        return None
    return {"sources": {flag: {"what": f"--{flag} file {entry.get('file') or entry.get('module')}",
                               "sha256": entry["sha256"]}
                        for flag, entry in recorded.items() if isinstance(entry, dict) and entry.get("sha256")}}
