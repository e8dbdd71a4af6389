"""``compile()`` as ``tfgpu.fit`` trains it: the compiled optimizer, loss and metrics, translated once.

A model given to ``tfgpu.fit`` (or returned by its builder) that was compiled is trained with what ``compile()``
says, not with tfgpu's defaults:

- the optimizer: its class and whole config (learning rate or ``LearningRateSchedule``, momentum, weight decay,
  EMA, ...) rebuilt inside the strategy scope. Keras clips each replica's partial gradient before the all-reduce
  (``clipnorm``, ``clipvalue``, ``global_clipnorm``), which on several replicas is not what one device does; so
  those three are taken out of the optimizer and applied here to the all-reduced gradient (``clip``), as one device
  would;
- the loss: sparse/categorical cross-entropy (``from_logits``, ``label_smoothing``) is tfgpu's own cross-entropy from
  the logits; binary cross-entropy (one sigmoid unit or logit, labels 0/1) its sigmoid cross-entropy from the
  logit; any other per-example ``keras.losses`` loss is called per example and reduced as the loop reduces (summed
  over the replica's examples, divided by the global batch). A loss that needs more than one example at a
  time, or several outputs, is refused by name;
- the metrics and weighted metrics: Keras' own metric objects, named as Keras names them (``History`` uses the
  names), their state summed over every replica and worker (``fit_metrics``); one that cannot be summed is refused
  by name.

The registry maps a registered model name (``fit:...``) to its ``Compiled``; ``tasks.classification`` reads it
(``lookup``) and trains as it says. An uncompiled model trains with tfgpu's defaults (``defaults_line``).
"""
import dataclasses
import logging

from tfgpu.config import ConfigError

log = logging.getLogger("tfgpu")

CROSS_ENTROPY = {"sparse_categorical_crossentropy": False, "categorical_crossentropy": True}  # name -> one-hot
CLIPPING = ("clipnorm", "clipvalue", "global_clipnorm")
REFUSED_OPTIMIZER_OPTIONS = {
    "gradient_accumulation_steps": "accumulates over steps; tfgpu's grad_accum_steps=N splits each batch into N "
                                   "micro-batches instead (the same update): pass that",
    "loss_scale_factor": "set precision='mixed_float16' (tfgpu's dynamic loss scale) instead",
}
BINARY = "binary_crossentropy"  # one sigmoid unit (or logit) scoring class 1 of labels 0/1
REFUSED_LOSSES = {
    "binary_focal_crossentropy": "tfgpu.fit trains softmax cross-entropy over the classes or binary_crossentropy "
                                 "of one sigmoid unit",
    "ctc": "needs whole sequences, not one example at a time",
}
_REGISTRY = {}  # registered model name -> Compiled


@dataclasses.dataclass
class Compiled:
    """What ``compile()`` said, as the classification task applies it. ``optimizer_class``/``optimizer_config``: the
    compiled optimizer's, read at once (None: tfgpu's; after TensorFlow's runtime restarts the user's optimizer
    cannot be read); ``loss_name``: the loss's Keras name; ``label_smoothing``; ``loss``: a per-example callable for
    a loss other than cross-entropy (None: cross-entropy); ``metric_names``: the compiled accuracy names, as History
    keys; ``class_weight``: {class: weight} for the train loss; ``one_hot``: whether the user's labels were one-hot
    (what a generic loss is given); ``clipping``: Keras' clipnorm/clipvalue/global_clipnorm, done by ``clip``."""
    optimizer_class: type = None
    optimizer_config: dict = None
    loss_name: str = "sparse_categorical_crossentropy"
    label_smoothing: float = 0.0
    loss: object = None
    metric_names: tuple = ()
    class_weight: dict = None
    one_hot: bool = False
    clipping: dict = dataclasses.field(default_factory=dict)
    from_logits: object = None  # the cross-entropy's from_logits (None: another loss, or not compiled)
    built_optimizer: object = None  # the optimizer the run trains with (make_optimizer), for copying its state back
    metric_identifiers: tuple = ((), ())  # (metrics, weighted_metrics) as compiled
    sample_weights: dict = None  # split -> per-example weights by record index (fit_weights), None: none given
    metrics: object = None  # fit_metrics.CompiledMetrics of the run (make_metrics), read by the callbacks

    def make_metrics(self, num_outputs: int):
        """The run's ``fit_metrics.CompiledMetrics`` (fresh metric objects, in the current runtime), kept as
        ``metrics``."""
        from tfgpu.training import fit_metrics

        self.metrics = fit_metrics.CompiledMetrics(fit_metrics.resolve(*self.metric_identifiers, self.one_hot,
                                                                       num_outputs))
        return self.metrics

    @property
    def compiled(self) -> bool:
        return self.optimizer_class is not None

    @property
    def binary(self) -> bool:
        """Compiled with binary_crossentropy: the model gives one sigmoid probability (or logit) of class 1."""
        return self.loss_name == BINARY

    def make_optimizer(self):
        """A new optimizer of the compiled class and config, without the per-replica clipping (``clip`` does it on
        the all-reduced gradient); call inside the strategy scope."""
        config = dict(self.optimizer_config, **{name: None for name in CLIPPING})
        self.built_optimizer = self.optimizer_class.from_config(config)
        return self.built_optimizer

    def describe(self) -> str:
        rate = self.optimizer_config["learning_rate"]
        rate = f"{rate:.4g}" if isinstance(rate, (int, float)) else type(rate).__name__
        extra = "".join(f", {k}={v:g}" for k, v in self.clipping.items())
        for name in ("momentum", "weight_decay"):
            if self.optimizer_config.get(name):
                extra += f", {name}={self.optimizer_config[name]:g}"
        if self.optimizer_config.get("use_ema"):
            extra += ", use_ema=True"
        smoothing = f", label_smoothing={self.label_smoothing:g}" if self.label_smoothing else ""
        return (f"compile(): optimizer={self.optimizer_class.__name__}(learning_rate={rate}{extra}) "
                f"loss={self.loss_name}{smoothing} metrics={list(self.metric_names)}")


def register(name: str, compiled: Compiled) -> None:
    _REGISTRY[name] = compiled


def lookup(name: str):
    """The ``Compiled`` of registered model ``name``, or None (a model trained with tfgpu's options)."""
    return _REGISTRY.get(name)


def defaults_line(optimizer: str, learning_rate: float, schedule: str) -> str:
    return (f"the model is not compiled: tfgpu's defaults train it (optimizer={optimizer}, learning rate "
            f"{learning_rate:g} per 256 examples with a {schedule} schedule, softmax cross-entropy, metrics=accuracy); "
            "compile it to choose")


def of_model(model, argument: str = "model") -> Compiled:
    """The ``Compiled`` of a Keras model (``compiled`` False when it was never compiled); ConfigError(argument)
    naming a loss, metric or optimizer option the loop cannot distribute correctly."""
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        return Compiled()
    import keras

    optimizer = model.optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer  # the precision option sets tfgpu's own loss scaling
    config = optimizer.get_config()
    for name, why in REFUSED_OPTIMIZER_OPTIONS.items():
        if config.get(name):
            raise ConfigError(argument, f"compiled with {type(optimizer).__name__}({name}={config[name]}): {why}")
    clipping = {name: float(config[name]) for name in CLIPPING if config.get(name)}
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        config["learning_rate"] = schedule  # the same (stateless) schedule object, custom classes included
    compile_config = model.get_compile_config() or {}
    loss_name, smoothing, loss, one_hot, from_logits = _loss(model.loss, argument)
    if compile_config.get("loss_weights"):
        raise ConfigError(argument, "compiled with loss_weights: tfgpu.fit trains one output")
    metric_identifiers, names = _metrics(model, one_hot, argument)
    return Compiled(type(optimizer), config, loss_name, smoothing, loss, names, None, one_hot, clipping, from_logits,
                    metric_identifiers=metric_identifiers)


def _loss(loss, argument: str):
    """(Keras name, label smoothing, per-example callable or None for cross-entropy, labels one-hot, from_logits)."""
    import keras

    if loss is None:
        raise ConfigError(argument, "compiled without a loss; compile(loss='sparse_categorical_crossentropy', ...)")
    if isinstance(loss, (list, tuple, dict)):
        raise ConfigError(argument, f"compiled with {len(loss)} losses: tfgpu.fit trains one output and one loss")
    if isinstance(loss, str):
        name = loss
        loss = keras.losses.get(loss)
    else:
        name = _loss_name(loss)
    options = getattr(loss, "_fn_kwargs", None) or {}
    fn = getattr(loss, "fn", None) or loss
    fn_name = getattr(fn, "__name__", name)
    if name in REFUSED_LOSSES or fn_name in REFUSED_LOSSES:
        key = name if name in REFUSED_LOSSES else fn_name
        raise ConfigError(argument, f"compiled with loss {key}: {REFUSED_LOSSES[key]}")
    if fn_name == BINARY:
        return BINARY, float(options.get("label_smoothing", 0.0) or 0.0), None, False, bool(options.get("from_logits",
                                                                                                      False))
    if fn_name in CROSS_ENTROPY:
        if options.get("axis", -1) != -1:
            raise ConfigError(argument, f"compiled with {fn_name}(axis={options['axis']}): classes must be the last "
                              "axis")
        return (fn_name, float(options.get("label_smoothing", 0.0) or 0.0), None, CROSS_ENTROPY[fn_name],
                bool(options.get("from_logits", False)))
    if isinstance(loss, keras.losses.Loss):
        per_example = loss.call
    elif callable(loss):
        per_example = loss
    else:
        raise ConfigError(argument, f"compiled with loss {loss!r}, which is not a keras.losses.Loss or a function")
    return name, 0.0, per_example, "categorical" in name, None


def _loss_name(loss) -> str:
    fn = getattr(loss, "fn", None)
    if fn is not None:
        return getattr(fn, "__name__", type(loss).__name__)
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def check_from_logits(compiled: Compiled, head, name: str) -> None:
    """One warning when ``from_logits`` disagrees with the model's head: tfgpu trains from the logits either way
    (``tfgpu.models.heads``), which is what a consistent script means."""
    from_logits = compiled.from_logits
    if from_logits is None:
        return
    activation = "sigmoid" if compiled.binary else "softmax"
    if from_logits and head.gives_probabilities:
        log.warning("%s ends in a %s but was compiled with from_logits=True: tfgpu trains the cross-entropy "
                    "from the logits under that %s", name, activation, activation)
    elif not from_logits and not head.gives_probabilities:
        log.warning("%s gives logits (no %s) but was compiled with from_logits=False: tfgpu trains the "
                    "cross-entropy from those logits, as from_logits=True would", name, activation)


def _metrics(model, one_hot: bool, argument: str):
    """((metrics, weighted_metrics) as compiled, their History names); ConfigError naming one the loop cannot sum
    over replicas (``fit_metrics.resolve``, tried now on the model's output size, before any work)."""
    from tfgpu.training import fit_metrics

    metrics, weighted = fit_metrics.identifiers(model)
    if isinstance(metrics, dict) or isinstance(weighted, dict):
        raise ConfigError(argument, "compiled with metrics per output: tfgpu.fit trains one output")
    outputs = getattr(model, "outputs", None)
    num_outputs = int(outputs[0].shape[-1]) if outputs and outputs[0].shape[-1] is not None else 2
    entries = fit_metrics.resolve(metrics, weighted, one_hot, num_outputs, argument)
    return (tuple(metrics), tuple(weighted)), tuple(name for name, _, _ in entries)


def clip(grads, clipping: dict, loss_scale, num_replicas: int):
    """Keras' clipnorm/clipvalue/global_clipnorm applied to the all-reduced gradient (measured unscaled), as one
    device applies them; returns per-replica shares the optimizer's sum turns back into the clipped sum."""
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads) if ctx and num_replicas > 1 else list(grads)
    scale = tf.cast(loss_scale, tf.float32)
    total = [tf.cast(g, tf.float32) / scale for g in total]
    if "clipvalue" in clipping:
        total = [tf.clip_by_value(g, -clipping["clipvalue"], clipping["clipvalue"]) for g in total]
    if "clipnorm" in clipping:
        total = [tf.clip_by_norm(g, clipping["clipnorm"]) for g in total]
    if "global_clipnorm" in clipping:
        total, _ = tf.clip_by_global_norm(total, clipping["global_clipnorm"])
    return [tf.cast(t * scale / num_replicas, g.dtype) for t, g in zip(total, grads)]
