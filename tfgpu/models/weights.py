"""Initial weights (``--init_weights``): a local ``.weights.h5`` or ``.keras`` file loaded into a built model.

Keras 3 writes a ``.weights.h5`` file (and the ``model.weights.h5`` inside a ``.keras`` archive) by
structure, not by name: a layer's group is ``layers/<snake_case class>[_<n>]/vars`` in the order of the
model's layers (``layers/dense_1/vars/0`` is the kernel of the second Dense layer), and ``load_weights``
walks the same way. So a file only loads into a model whose layers come in the same classes and order,
and a new or extra layer shifts every path after it. Keras 3.15 also records each layer's name on its
group (the ``name`` attribute of ``.../vars``), which is what this module matches on instead: a layer of
the model takes the weights the file holds for the layer of the same name (the path of names through
nested models, e.g. ``backbone/conv1``; a name that is unique on both sides also matches a layer nested
one level differently, so a backbone saved alone loads into a model that nests it, and a subclassed model
loads through the float32 wrapper ``create_model`` puts around it). Within a layer, weights are matched
by position and checked by shape.

Loading writes the model's own weights to a temporary ``.weights.h5``, overwrites the matched layers
with the file's arrays and has Keras load that file back strictly, so Keras still decides which
variables each layer owns. The optimizer state a compiled model's file carries is ignored (tfgpu's
optimizer starts fresh). Nothing is downloaded. Errors are ``ConfigError("init_weights", ...)``: one
line naming the file, the layer, the weight and both shapes.
"""
import dataclasses
import io
import logging
import os
import shutil
import tempfile
import zipfile

import numpy as np

from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")

SUFFIXES = (".weights.h5", ".keras")
_KERAS_ARCHIVE_WEIGHTS = "model.weights.h5"  # the weights inside a .keras zip archive
_SHOWN = 6  # names listed in a message before "..."


@dataclasses.dataclass
class Entry:
    """One layer's own weights in a weights file: where Keras put them and the names leading to the layer."""
    group: str  # the HDF5 group holding the arrays, e.g. "layers/functional/layers/conv2d/vars"
    names: tuple  # layer names from the outermost nested model down, e.g. ("backbone", "conv1")
    arrays: list  # numpy arrays (or HDF5 datasets), in the layer's order

    @property
    def label(self) -> str:
        return "/".join(self.names)


@dataclasses.dataclass
class LoadResult:
    loaded: list  # labels of the model's layers that took the file's weights
    skipped: list  # "label (why)" of the model's layers left as initialized
    unused: list  # labels of the file's layers no layer of the model took


def _describe(names, limit: int = _SHOWN) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def check_file(path: str) -> None:
    """Refuses (ConfigError naming --init_weights) a path that is not a readable local .weights.h5 or .keras
    file, before anything is built."""
    if not path.endswith(SUFFIXES):
        raise ConfigError("init_weights", f"{path}: expected a local .weights.h5 or .keras file (Keras 3 "
                          "model.save_weights / model.save)")
    if "://" in path:
        raise ConfigError("init_weights", f"{path}: initial weights are read from a local file, never downloaded")
    if not os.path.isfile(path):
        raise ConfigError("init_weights", f"{path}: no such file")
    import h5py

    if path.endswith(".keras"):
        if not zipfile.is_zipfile(path):
            raise ConfigError("init_weights", f"{path}: not a .keras archive (a zip file written by model.save)")
        with zipfile.ZipFile(path) as archive:
            if _KERAS_ARCHIVE_WEIGHTS not in archive.namelist():
                raise ConfigError("init_weights", f"{path}: the archive holds no {_KERAS_ARCHIVE_WEIGHTS} (saved "
                                  "with sharded or npz weights, or not by Keras 3)")
    elif not h5py.is_hdf5(path):
        raise ConfigError("init_weights", f"{path}: not an HDF5 file (write it with Keras 3 model.save_weights)")


def _entries(h5file) -> list:
    """Every layer with weights in an open Keras 3 weights file, in the file's order."""
    import h5py

    groups = {}  # parent path -> (vars group, layer name)

    def visit(path, obj):
        if "optimizer" in path.split("/"):  # a compiled model's file carries its optimizer: tfgpu builds its own
            return
        if isinstance(obj, h5py.Group) and (path == "vars" or path.endswith("/vars")):
            name = obj.attrs.get("name")
            groups[path[:-len("vars")].rstrip("/")] = (obj, name.decode() if isinstance(name, bytes) else name)

    h5file.visititems(visit)
    entries = []
    for parent, (group, name) in groups.items():
        if not len(group):
            continue
        if name is None:
            raise ValueError(f"group {group.name} has no layer name: the file was written by a Keras older than "
                             "3.15 (load it into your model with Keras and save it again)")
        parts = parent.split("/") if parent else []
        ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
        # The root model's own weights (a subclassed model's add_weight) go by the root's name.
        names = tuple(groups[a][1] for a in ancestors if a in groups) + (name,)
        keys = sorted(group.keys(), key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
        entries.append(Entry(group.name, names, [group[k] for k in keys]))
    return entries


class _Opened:
    """The HDF5 file of weights behind a .weights.h5 path or inside a .keras archive, as a context manager."""

    def __init__(self, path: str, mode: str = "r"):
        self.path, self.mode = path, mode

    def __enter__(self):
        import h5py

        if self.path.endswith(".keras"):
            with zipfile.ZipFile(self.path) as archive:
                self._h5 = h5py.File(io.BytesIO(archive.read(_KERAS_ARCHIVE_WEIGHTS)), "r")
        else:
            self._h5 = h5py.File(self.path, self.mode)
        return self._h5

    def __exit__(self, *exc):
        self._h5.close()


def _match(model_entries: list, file_entries: list) -> tuple:
    """(pairs of (model entry, file entry), model entries without a match, file entries without a match):
    by the path of layer names, then by a layer name that is unique among the rest on both sides."""
    by_names = {}
    for entry in file_entries:
        by_names.setdefault(entry.names, []).append(entry)
    pairs, rest_model = [], []
    taken = set()
    for entry in model_entries:
        found = by_names.get(entry.names, [])
        if len(found) == 1 and id(found[0]) not in taken:
            pairs.append((entry, found[0]))
            taken.add(id(found[0]))
        else:
            rest_model.append(entry)
    rest_file = [e for e in file_entries if id(e) not in taken]

    def unique_leaves(entries):
        counts = {}
        for e in entries:
            counts[e.names[-1]] = counts.get(e.names[-1], 0) + 1
        return {e.names[-1]: e for e in entries if counts[e.names[-1]] == 1}

    model_leaves, file_leaves = unique_leaves(rest_model), unique_leaves(rest_file)
    unmatched_model = []
    for entry in rest_model:
        other = file_leaves.get(entry.names[-1]) if model_leaves.get(entry.names[-1]) is entry else None
        if other is not None:
            pairs.append((entry, other))
            taken.add(id(other))
        else:
            unmatched_model.append(entry)
    return pairs, unmatched_model, [e for e in file_entries if id(e) not in taken]


def _variable_names(model) -> dict:
    """Layer name -> names of its own variables in saving order (for messages only)."""
    names = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        own = list(getattr(layer, "_trainable_variables", [])) + list(getattr(layer, "_non_trainable_variables", []))
        names.setdefault(layer.name, [v.name for v in own])
    return names


def _mismatch(model_entry: Entry, file_entry: Entry, variable_names: dict) -> str:
    """Why the file's arrays do not fit the model's layer, or "" when they do."""
    theirs, ours = file_entry.arrays, model_entry.arrays
    if len(theirs) != len(ours):
        return f"{len(theirs)} weights in the file, {len(ours)} in the model"
    for i, (a, b) in enumerate(zip(theirs, ours)):
        if tuple(a.shape) != tuple(b.shape):
            own = variable_names.get(model_entry.names[-1], [])
            weight = own[i] if i < len(own) else f"#{i}"
            return f"weight {weight} has shape {tuple(a.shape)} in the file, {tuple(b.shape)} in the model"
    return ""


def _refuse_unmatched(path: str, missing: list, unused: list, file_entries: list) -> None:
    """Without --init_skip_mismatch every layer of the model and of the file must be matched."""
    if missing:
        raise ConfigError("init_weights", f"{path}: the model's layer(s) {_describe(e.label for e in missing)} are "
                          f"not in the file (its layers: {_describe(e.label for e in file_entries)}); "
                          "--init_skip_mismatch keeps them as initialized")
    if unused:
        raise ConfigError("init_weights", f"{path}: the file's layer(s) {_describe(e.label for e in unused)} match "
                          "no layer of the model; --init_skip_mismatch ignores them")


def load_initial_weights(model, path: str, skip_mismatch: bool = False) -> LoadResult:
    """Loads ``path`` into ``model`` layer by layer name (see the module docstring).

    Without ``skip_mismatch`` every layer of the model that has weights must find a layer of the same
    shapes in the file and every layer of the file must be used, else ConfigError naming the layer and
    both shapes. With it the layers that fit load, the others keep their initial weights, and the result
    says which (the caller logs it)."""
    check_file(path)
    workdir = tempfile.mkdtemp(prefix="tfgpu-init-weights-")
    try:
        merged = os.path.join(workdir, "merged.weights.h5")
        model.save_weights(merged)  # the model's own layout, overwritten below with what the file has for it
        with _Opened(path) as source, _Opened(merged, "r+") as target:
            try:
                file_entries = _entries(source)
            except ValueError as e:
                raise ConfigError("init_weights", f"{path}: {e}") from None
            pairs, missing, unused = _match(_entries(target), file_entries)
            if not skip_mismatch:
                _refuse_unmatched(path, missing, unused, file_entries)
            variable_names = _variable_names(model)
            loaded, skipped = [], [f"{e.label} (not in the file)" for e in missing]
            for ours, theirs in pairs:
                why = _mismatch(ours, theirs, variable_names)
                if why and not skip_mismatch:
                    raise ConfigError("init_weights", f"{path}: layer {ours.label}: {why}; --init_skip_mismatch "
                                      "loads the layers that fit and keeps this one as initialized")
                if why:
                    skipped.append(f"{ours.label} ({why})")
                    continue
                for dataset, array in zip(ours.arrays, theirs.arrays):
                    dataset[...] = np.asarray(array[()], dtype=dataset.dtype)
                loaded.append(ours.label)
            if not loaded:
                raise ConfigError("init_weights", f"{path}: no layer of the model matches a layer of the file "
                                  f"by name and shapes (the file's: {_describe(e.label for e in file_entries)})")
        model.load_weights(merged)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return LoadResult(loaded, skipped, [e.label for e in unused])
