"""What a built model is, as a resume compares it: its layers (class, config, what feeds them), its variables
(path, shape) and the code that built it (a user file's or a ``tfgpu.fit`` model function's sha256).

Each checkpoint carries the fingerprint of the models that wrote it (``training.checkpoint``); a resume whose
freshly built models differ is refused in one line naming the first differences (``differences``), unless
``--allow_config_change=model`` (``training.config_change.model_changes``). A checkpoint's shape check alone let an
edited model resume silently: another activation or pooling layer has the same variables.

Left out, because an option compares them already or the restored checkpoint replaces them: each layer's
``name`` (it is the key), ``dtype`` (--precision), ``trainable`` (--freeze, --unfreeze_at_step), ``synchronized``
(--sync_batch_norm), initializers (--zero_init_residual; the restored weights replace what they drew), input and
build shapes (--image_size), and the float32 cast tfgpu adds under mixed precision (an ``Activation("linear")``, which
computes nothing). A config key that only one side has (a newer Keras's new argument) is not a difference.
Cost: one walk of the layers and one ``get_config`` each, when the trainer is built (milliseconds).
"""
import dataclasses
import hashlib
import json

FORMAT = 1
_IGNORED_KEYS = {"name", "dtype", "trainable", "synchronized", "layers", "input_layers", "output_layers",
                 "build_config", "compile_config", "build_input_shape", "batch_shape", "batch_input_shape",
                 "input_shape", "seed_generator"}
_SHOWN = 3  # differences named in the one line; the rest are counted


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way the recorded model and this run's differ: ``what`` (a layer, its setting, a variable, a file) and its
    recorded and current value as text."""
    what: str
    old: str
    new: str

    def describe(self) -> str:
        return f"{self.what} changed: {self.old} -> {self.new}"


def of(models: dict, sources: dict) -> dict:
    """The fingerprint of ``models`` ({checkpoint item: keras.Model}) built by ``sources`` ({flag: {"what": text,
    "sha256": hex}}, ``provenance.builder_sources``): JSON-able, saved in each checkpoint."""
    return {"format": FORMAT, "sources": sources,
            "models": {name: {"layers": dict(_layers(model, "")),
                              "variables": {v.path: [int(d) for d in v.shape] for v in model.variables}}
                       for name, model in sorted(models.items())}}


def _layers(layer, prefix: str):
    """(path, {"class", "config", "inputs"}) of every layer and graph op under ``layer``, nested ones by path."""
    import keras

    for child in _children(layer):
        if isinstance(child, keras.layers.InputLayer) or _computes_nothing(child):
            continue
        path = f"{prefix}/{child.name}" if prefix else child.name
        entry = {"class": type(child).__name__, "config": _config(child)}
        inputs = sorted({t._keras_history.operation.name for node in getattr(child, "_inbound_nodes", ())
                         for t in node.input_tensors if getattr(t, "_keras_history", None)})
        if inputs:
            entry["inputs"] = inputs
        yield path, entry
        yield from _layers(child, path)


def _children(layer) -> list:
    """The layers (and, in a functional graph, the ops) directly inside ``layer``."""
    operations = getattr(layer, "operations", None)  # a functional model's layers and keras.ops calls
    if isinstance(operations, list) and operations:
        return operations
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False, recursive=False)) if flatten else []


def _computes_nothing(layer) -> bool:
    import keras

    return isinstance(layer, keras.layers.Activation) and getattr(layer.activation, "__name__", "") == "linear"


def _config(layer) -> dict:
    """``layer``'s own settings as JSON values, less what an option compares or a restore replaces (module
    docstring); {} when it has no config Keras can give (a custom layer without ``get_config``)."""
    try:
        config = layer.get_config()
    except Exception:  # noqa: BLE001 (Keras raises NotImplementedError or TypeError for such layers)
        return {}
    if not isinstance(config, dict):
        return {}
    kept = {k: v for k, v in config.items() if k not in _IGNORED_KEYS and not k.endswith("_initializer")}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def _show(value) -> str:
    if isinstance(value, dict) and "class_name" in value:  # a serialized object: its class and settings
        settings = {k: v for k, v in (value.get("config") or {}).items() if k not in _IGNORED_KEYS}
        return f"{value['class_name']}({', '.join(f'{k}={_show(v)}' for k, v in sorted(settings.items()))})"
    return repr(value) if isinstance(value, str) else json.dumps(value)


def differences(old: dict, new: dict) -> list:
    """Every ``Difference`` between a recorded fingerprint and this run's: per model, layers removed, added or of
    another class, settings changed, what feeds a layer, variables; then the code that built them."""
    found = []
    # A record of the sources alone (model_source.json of a run older than fingerprints) compares them alone.
    old_models, new_models = (old["models"], new.get("models", {})) if "models" in old else ({}, {})
    several = len(set(old_models) | set(new_models)) > 1
    for name in sorted(set(old_models) | set(new_models)):
        where = f"{name} " if several else ""
        if name not in old_models or name not in new_models:
            found.append(Difference(f"{where}model".strip(), "absent" if name not in old_models else "built",
                                    "absent" if name not in new_models else "built"))
            continue
        found += _model_differences(old_models[name], new_models[name], where)
    old_sources, new_sources = old.get("sources", {}), new.get("sources", {})
    for flag in sorted(set(old_sources) & set(new_sources)):
        before, after = old_sources[flag], new_sources[flag]
        if before.get("sha256") and after.get("sha256") and before["sha256"] != after["sha256"]:
            found.append(Difference(after.get("what") or f"--{flag}'s code", f"sha256 {before['sha256'][:12]}",
                                    f"sha256 {after['sha256'][:12]}"))
    return found


def _model_differences(old: dict, new: dict, where: str) -> list:
    found = []
    old_layers, new_layers = old.get("layers", {}), new.get("layers", {})
    removed = [path for path in old_layers if path not in new_layers]
    added = [path for path in new_layers if path not in old_layers]
    # As many layers gone as come, in graph order: the same places under new names (Keras names a layer by its
    # class, so GlobalAveragePooling2D -> GlobalMaxPooling2D renames it too); compared as one layer each.
    renamed = dict(zip(removed, added)) if len(removed) == len(added) else {}
    for path in removed:
        if path in renamed:
            now = new_layers[renamed[path]]
            found.append(Difference(f"{where}layer {path!r} (now {renamed[path]!r})", old_layers[path]["class"],
                                    now["class"]))
        else:
            found.append(Difference(f"{where}layer {path!r}", old_layers[path]["class"], "absent"))
    for path in added:
        if path not in renamed.values():
            found.append(Difference(f"{where}layer {path!r}", "absent", new_layers[path]["class"]))
    for path, now in new_layers.items():
        then = old_layers.get(path)
        if then is None or then["class"] != now["class"]:
            if then is not None:
                found.append(Difference(f"{where}layer {path!r}", then["class"], now["class"]))
            continue
        for key in sorted(set(then["config"]) & set(now["config"])):
            if then["config"][key] != now["config"][key]:
                found.append(Difference(f"{where}layer {path!r} {key}", _show(then["config"][key]),
                                        _show(now["config"][key])))
        inputs_then = sorted(renamed.get(name, name) for name in then.get("inputs", ()))
        if "inputs" in then and "inputs" in now and inputs_then != now["inputs"]:
            found.append(Difference(f"{where}layer {path!r} inputs", ",".join(then["inputs"]),
                                    ",".join(now["inputs"])))
    old_vars, new_vars = old.get("variables", {}), new.get("variables", {})
    for path in sorted(set(old_vars) | set(new_vars)):
        if old_vars.get(path) != new_vars.get(path):
            found.append(Difference(f"{where}variable {path!r}", str(old_vars.get(path, "absent")),
                                    str(new_vars.get(path, "absent"))))
    return found


def summary(found: list) -> str:
    """The first differences in a line, with how many more there are."""
    shown = "; ".join(d.describe() for d in found[:_SHOWN])
    return shown + (f" (and {len(found) - _SHOWN} more)" if len(found) > _SHOWN else "")


def sha256_of_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
