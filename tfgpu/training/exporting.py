"""What a run deploys and how its user feeds it: the exported models (.keras files or SavedModels; a classifier's
``model.keras`` takes pixels 0..255 with the run's --input_range mapping inside, ``model.bare.keras`` is the
network alone; both float32 whatever the training precision) and, beside them, ``<name>.input.json`` (input
shape, dtype and range of each, output: logits or probabilities, a generator's image range; classes).

Used by the training run's own export (``experiment.run``) and by ``python -m tfgpu.export``. ``output`` may be
any path TensorFlow opens (``gs://``, ``ram://``): Keras and the SavedModel exporter write to the local disk
first and the files are then copied there (``tfgpu.runtime.fileio``).
"""
import json
import os
import tempfile

from tfgpu.runtime import fileio
from tfgpu.runtime.fileio import atomic_local_path, atomic_write_bytes


def variant_path(output: str, variant: str) -> str:
    """Where export ``variant`` of an export at ``output`` goes: ``model.keras`` -> ``model.bare.keras``,
    ``saved_model`` -> ``saved_model.bare``; the default variant ("") at ``output`` itself."""
    if not variant:
        return output
    stem = output.rstrip("/")
    return f"{stem[:-len('.keras')]}.{variant}.keras" if stem.endswith(".keras") else f"{stem}.{variant}"


def export_model(task, path: str) -> str:
    """Saves each of the task's exports (``Task.export_variants``) as a .keras file at ``variant_path(path, v)``,
    each atomically (``fileio.atomic_local_path``); returns ``path``."""
    fileio.makedirs(fileio.parent(path))
    for variant in task.export_variants:
        with atomic_local_path(variant_path(path, variant), suffix=".keras") as tmp:
            task.export(tmp, variant)
    return path


def description_path(output: str) -> str:
    """Where the description of an export at ``output`` goes: ``export/model.keras`` -> ``export/model.input.json``,
    ``export/saved_model`` -> ``export/saved_model.input.json``."""
    stem = output.rstrip("/")
    return (stem[:-len(".keras")] if stem.endswith(".keras") else stem) + ".input.json"


def describe(config, info, facts: dict | None = None) -> dict:
    """What an exported model takes and returns, for its user: the task's own description where it has one
    (``Task.describe_export``: a GAN generator's latent and image range), else a classifier's: its input range
    (--input_range, checked against a leading Rescaling when the model was built) and whether it gives logits or
    probabilities. ``facts``: the task's ``model_facts()`` (None: a classifier that gives logits); its
    ``output_meaning`` describes the output (default ``OUTPUT_MEANINGS``: one per class), ``output_units`` its width
    (default: one per class)."""
    facts = facts or {}
    from tfgpu.tasks.registry import get_task

    own = get_task(config.task).describe_export(config, info, facts)
    if own is not None:
        return own
    h, w, c = info.image_shape
    images = {"dtype": "float32", "layout": "NHWC", "shape": [None, h, w, c]}
    low, high = (float(v) for v in config.input_range)
    kind = facts.get("model_output", "logits")
    return {"task": config.task, "model": config.model,
            "input": {**images, "range": [0.0, 255.0],
                      "meaning": f"pixels 0..255 as uint8 or float32, of size {h}x{w} with {c} channel(s): the run's "
                                 f"--input_range mapping ({low:g}..{high:g}) is inside the model"},
            "output": {"dtype": "float32", "shape": [None, int(facts.get("output_units") or info.num_classes)],
                       "kind": kind,
                       "meaning": facts.get("output_meaning") or OUTPUT_MEANINGS[kind]},
            "bare": {"meaning": "the same network without the pixel mapping",
                     "input": {**images, "range": [low, high],
                               "from_uint8": f"pixels 0..255 map linearly to {low:g}..{high:g}: "
                                             f"x / 255 * ({high:g} - {low:g}) + {low:g}"}},
            "classes": list(info.classes)}


OUTPUT_MEANINGS = {"logits": "logits, one per class (softmax gives probabilities)",
                   "probabilities": "probabilities, one per class, summing to 1 (the model ends in a softmax)"}


def summary(description: dict) -> str:
    """One line for the log: what the exported model takes (and gives, where that is not the usual)."""
    output = description["output"]
    if "bare" not in description:  # it takes no pixels (a generator's latent): what it gives is what to say
        bounds = output.get("range")
        return f"outputs {output['dtype']} {output['meaning']}" + (f" in [{bounds[0]:g}, {bounds[1]:g}]" if bounds
                                                                    else "")
    low, high = description["bare"]["input"]["range"]
    gives = "; output: probabilities" if output["kind"] == "probabilities" else ""
    bare = f"; {description['bare']['file']}: float32 in [{low:g}, {high:g}]" if "file" in description["bare"] else ""
    return f"input: NHWC pixels 0..255 (uint8 or float32){bare}{gives}"


def read_description(path: str) -> dict:
    """A written ``<name>.input.json``."""
    return json.loads(fileio.read_text(path))


def write_description(config, info, output: str, facts: dict | None = None) -> str:
    """Writes ``description_path(output)`` (atomically) and returns its path."""
    path = description_path(output)
    fileio.makedirs(fileio.parent(path))
    description = describe(config, info, facts)
    if "bare" in description:
        description["bare"]["file"] = os.path.basename(variant_path(output, "bare").rstrip("/"))
    atomic_write_bytes(path, (json.dumps(description, indent=2) + "\n").encode())
    return path


def save(task, fmt: str, output: str) -> None:
    """Writes what the task deploys (a GAN: its EMA generator) as a .keras file or a SavedModel directory.

    A local SavedModel is written beside ``output`` and renamed into place; on a path with a scheme it is
    written locally, the old directory removed and the files copied one by one (not atomic as a whole)."""
    fileio.makedirs(fileio.parent(output))
    if fmt == "keras":
        export_model(task, output)
        return
    for variant in task.export_variants:
        _save_model(task.deployable(variant), variant_path(output, variant))


def _save_model(model, output: str) -> None:
    if fileio.has_scheme(output):
        with tempfile.TemporaryDirectory(prefix="tfgpu-export-") as local:
            model.export(os.path.join(local, "saved_model"), format="tf_saved_model", verbose=False)
            fileio.rmtree(output)
            fileio.copy_tree(os.path.join(local, "saved_model"), output)
        return
    import shutil

    # an unpredictable name beside the target (tempfile), not one another user could create first
    parent, name = os.path.split(os.path.abspath(output.rstrip("/")))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{name}.tmp-")
    try:
        model.export(tmp, format="tf_saved_model", verbose=False)
        os.chmod(tmp, fileio.default_mode(directory=True))  # mkdtemp's 0700 -> what os.mkdir would give
        if os.path.exists(output):
            shutil.rmtree(output)
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
