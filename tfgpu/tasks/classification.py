"""Image classification: softmax cross-entropy over a registered classifier.

Losses are summed over the replica's examples and divided by the global batch,
so the optimizer's all-reduce (a sum) yields the mean gradient of the global
batch whatever the replica count. With --grad_accum_steps=k each replica's
batch is cut into k micro-batches whose gradients are summed before one update.

Fine-tuning: --init_weights loads a local Keras weights file into the built model (``models.weights``)
when no checkpoint was restored; --freeze keeps the matching layers out of training (``models.freeze``)
until --unfreeze_at_step, where the trainer stops a loop and the step is traced again over every variable.
The optimizer is built over all variables before freezing, so its slots and the checkpoint are the same
frozen or not, and a resume on either side of the unfreeze step is exact.

A model that ends in a softmax gives probabilities (``tfgpu.models.heads``): the loss is computed from the logits
that softmax takes (the same layers and weights, ``Head.logits``), or, where the softmax cannot be separated from
its layer (a subclassed model), from the probabilities in float32, clipped at ``classifier_head.PROBABILITY_FLOOR``. A sigmoid
head is refused: it scores each class on its own, which one softmax over the classes does not train; but a
``tfgpu.fit`` model compiled with binary_crossentropy ends in one sigmoid unit (or logit) scoring class 1 of labels
0/1 (``check_binary_model``). Under ``tfgpu.fit`` a step also adds to the compiled metrics' summed state
(``training.fit_metrics``) and weighs its examples by their ``sample_weight`` (``training.fit_weights``). A model whose
first layer is ``Rescaling(1/255)`` (it expects 0..255 pixels) is refused unless --input_range=0,255.
"""
import dataclasses
import logging

import keras
import tensorflow as tf

from tfgpu.config import InputConfig, OptimizationConfig, PrecisionConfig
from tfgpu.runtime import precision
from tfgpu.training import fit_compile, fit_weights, optimizers, results
from tfgpu.models import batch_norm, create_model, get_spec, heads, model_options
from tfgpu.models.summary import count_params
from tfgpu.tasks import classifier_head
from tfgpu.tasks.base import MetricSpec, Task, register_task, unpack_batch
from tfgpu.tasks.classifier_head import check_binary_model, check_model

log = logging.getLogger("tfgpu")
_LR_TITLE = "Learning rate (and the float16 loss scale)"


@register_task("classification")
class ClassificationTask(Task):
    metrics = (
        MetricSpec("loss", lower_is_better=True, plot="loss", title="Loss", panel="loss", label="train loss",
                   scale="log", progress=True),
        MetricSpec("val_loss", kind="eval", lower_is_better=True, plot="loss", panel="loss", label="eval loss"),
        MetricSpec("accuracy", lower_is_better=False, plot="accuracy", title="Accuracy", panel="accuracy",
                   label="train", progress=True),
        MetricSpec("val_accuracy", kind="eval", lower_is_better=False, plot="accuracy", panel="accuracy",
                   label="eval top-1"),
        MetricSpec("val_top5_accuracy", kind="eval", lower_is_better=False, plot="accuracy", panel="accuracy",
                   label="eval top-5"),
        MetricSpec("val_examples", kind="eval", counts_examples=True),
        MetricSpec("grad_norm"),
        MetricSpec("nonfinite_steps", counts_nonfinite=True),
        MetricSpec("learning_rate", plot="learning_rate", title=_LR_TITLE, panel="learning rate",
                   label="learning rate", scale="log", progress=True),
        MetricSpec("loss_scale", plot="learning_rate", panel="loss scale", label="loss scale", scale="log2",
                   progress=True),
    )
    # tfgpu.fit's compile() (``build`` sets them): None/empty for a run of the options alone
    compiled = None
    _label_smoothing = None
    _generic_loss = None
    _class_weights = None
    _clipping = {}
    _metrics = None
    _binary = False
    report_options = ("jit_compile", "optimizer", "base_learning_rate", "lr_schedule", "warmup_epochs", "warmup_steps",
                      "weight_decay", "label_smoothing", "grad_accum_steps", "init_weights", "freeze")

    def build(self):
        config = self.config
        if get_spec(config.model).family != "classifier":
            raise ValueError(f"--model={config.model} is not a classifier; use --task=gan")
        self.model = create_model(config.model, self.info.image_shape, self.info.num_classes,
                                  output=self.model_output, **model_options(config))
        self._binary = self.binary
        self.head = self.check_head(self.model)
        # What the loss is computed from: the model's logits, or the logits its softmax takes, or its probabilities.
        self._forward = self.head.logits if self.head.logits is not None else self.model
        self._from_probabilities = self.head.gives_probabilities and self.head.logits is None
        from tfgpu.data.pipeline import steps_per_epoch
        from tfgpu.models.freeze import Freezer
        self.freezer = Freezer(self.model, config.freeze) if config.freeze else None
        self.num_parameters = count_params(self.model)

        optimization = self.optimization = OptimizationConfig.of(config)
        inputs = InputConfig.of(config, self.batches_per_step(config))
        self.schedule = optimizers.learning_rate_schedule(optimization, self.total_steps,
                                                          steps_per_epoch(inputs, self.info), inputs.examples_per_step,
                                                          self.resumed_examples)
        # tfgpu.fit: what the model's compile() said (training/fit_compile.py); None or uncompiled: the options.
        self.compiled = fit_compile.lookup(config.model)
        compiled = self.compiled if self.compiled and self.compiled.compiled else None
        self._label_smoothing = compiled.label_smoothing if compiled else config.label_smoothing
        self._generic_loss = compiled.loss if compiled else None
        self._clipping = compiled.clipping if compiled else {}
        self._class_weights = (tf.constant([float(self.compiled.class_weight.get(c, 1.0))
                                            for c in range(self.info.num_classes)])
                               if self.compiled and self.compiled.class_weight else None)
        # tfgpu.fit's compiled metrics (Keras' objects, their state summed over replicas and workers)
        self._metrics = compiled.make_metrics(1 if self._binary else self.info.num_classes) if compiled else None
        if self._metrics:
            self._metrics.build(self.placement.strategy)
        else:
            self._metrics = None
        if compiled:
            fit_compile.check_from_logits(compiled, self.head, config.model)
            inner = compiled.make_optimizer()
            self.optimizer = precision.wrap_optimizer(inner, PrecisionConfig.of(config))
            self._learning_rate_now = lambda: tf.convert_to_tensor(inner.learning_rate).numpy()
        else:
            learning_rate = optimizers.ScheduleAtStep(self.schedule, self.global_step)
            self.optimizer = precision.wrap_optimizer(optimizers.create_optimizer(optimization, learning_rate),
                                                      PrecisionConfig.of(config))
            # The rate for the log, one compiled call per loop (the warmup + decay schedule run eagerly: ~0.9 ms).
            self._learning_rate_now = tf.function(lambda: self.schedule(self.global_step), autograph=False)
            # Slots for every variable, frozen or not: the same optimizer (and checkpoint) trains after the unfreeze.
            optimizers.exclude_from_decay(self.optimizer, self.model.trainable_variables)
        self.optimizer.build(self.model.trainable_variables)
        if self.freezer:
            self.freezer.freeze()
        self.num_trainable_while_frozen = count_params(self.model)
        self._trace_gradients()

    @property
    def binary(self) -> bool:
        """``tfgpu.fit``'s model compiled with binary_crossentropy: one sigmoid unit (or logit) scores class 1 of
        labels 0/1."""
        compiled = fit_compile.lookup(self.config.model)
        return bool(compiled is not None and compiled.binary)

    def model_output(self) -> tuple:
        if self.binary:
            return (1,), ("a model compiled with binary_crossentropy must give one sigmoid probability (or logit) "
                          "per image: shape (batch, 1)")
        return super().model_output()

    def examples(self):
        """Classification's examples; under ``tfgpu.fit`` with ``sample_weight``, each with its weight
        (``fit_weights.WeightedExamples``)."""
        compiled = fit_compile.lookup(self.config.model)
        if compiled is None or not compiled.sample_weights:
            return super().examples()
        return fit_weights.WeightedExamples(InputConfig.of(self.config, self.batches_per_step(self.config)), self.info,
                                            compiled.sample_weights)

    def check_head(self, model) -> heads.Head:
        """The head of the built model, once this task can train it (``check_model``, or ``check_binary_model``
        for binary_crossentropy); ConfigError otherwise."""
        if self._binary:
            return check_binary_model(model, self.config.model, self.info.num_classes, self.config.input_range)
        return check_model(model, self.config.model, self.info.num_classes, self.config.input_range)

    def _trace_gradients(self):
        """A fresh gradient function: a traced one keeps the trainable variables it was traced with."""
        # XLA compiles the forward and backward pass; the all-reduce and the update stay outside it. No
        # autograph, as in the train loop (loop.build_loop): it converted the model's every call again inside
        # this nested function, about a fifth of the train loop's tracing (ResNet-20, cProfile).
        self._grads_fn = (tf.function(self._gradients, jit_compile=True, autograph=False) if self.jit_compile
                          else self._gradients)

    def check_fine_tuning(self, loads_initial_weights):
        if self.config.init_weights and loads_initial_weights:
            from tfgpu.models.weights import check_file

            check_file(self.config.init_weights)

    def load_initial_weights(self):
        from tfgpu.models.weights import load_initial_weights

        path = self.config.init_weights
        result = load_initial_weights(self.model, path, self.config.init_skip_mismatch)
        log.info("--init_weights: loaded %d layer(s) from %s", len(result.loaded), path)
        if result.skipped:
            log.warning("--init_weights: kept as initialized (--init_skip_mismatch): %s", "; ".join(result.skipped))
        if result.unused:
            log.warning("--init_weights: layers of %s that no layer of the model took: %s", path,
                        ", ".join(result.unused))

    def step_boundaries(self):
        at = self.config.unfreeze_at_step
        return (at,) if self.freezer and 0 < at < self.total_steps else ()

    def at_step(self, step):
        at = self.config.unfreeze_at_step
        if not (self.freezer and self.freezer.frozen and at and step >= at):
            return False
        self.freezer.unfreeze()
        self._trace_gradients()
        log.info("step %d: --unfreeze_at_step=%d: every layer trains now (%s trainable parameters)", step, at,
                 f"{count_params(self.model):,}")
        return True

    def extend_result(self, result):
        counts = results.ParameterCounts(self.num_parameters, count_params(self.model),
                                         self.num_trainable_while_frozen if self.freezer and
                                         self.config.unfreeze_at_step else None)
        return super().extend_result(dataclasses.replace(result, parameters=counts))

    @property
    def jit_compile(self) -> bool:
        """--jit_compile, unless the replicas are logical CPUs or BatchNorm synchronizes inside the pass."""
        synced_bn = self.config.sync_batch_norm and self.placement.num_replicas > 1
        return self.config.jit_compile and not self.placement.on_logical_cpus and not synced_bn

    @property
    def train_metric_names(self):
        clipping = ("grad_norm",) if self.config.grad_clip_norm else ()
        return ("loss", "accuracy") + clipping + ("nonfinite_steps",)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def per_example_loss(self, labels, outputs):
        """Cross-entropy in float32 of ``outputs``: logits, or probabilities when the softmax is not separable."""
        outputs = tf.cast(outputs, tf.float32)
        num_classes = self.info.num_classes
        if self._binary:
            return classifier_head.binary_cross_entropy(labels, outputs, self._label_smoothing or 0.0,
                                                        self._from_probabilities)
        if self._generic_loss is not None:  # a compiled loss other than cross-entropy, on the model's output
            predicted = tf.nn.softmax(outputs) if self.head.gives_probabilities and not self._from_probabilities \
                else outputs
            truth = tf.one_hot(labels, num_classes) if self.compiled.one_hot else labels
            return tf.cast(self._generic_loss(truth, predicted), tf.float32)
        smoothing = self.config.label_smoothing if self._label_smoothing is None else self._label_smoothing
        return classifier_head.softmax_cross_entropy(labels, outputs, num_classes, smoothing, self._from_probabilities)

    def per_example_accuracy(self, labels, outputs):
        """The train "accuracy" of each example, 0..1: top-1 correct (binary: class 1 at probability > 0.5)."""
        if self._binary:
            positive = outputs[:, 0] > (0.5 if self._from_probabilities else 0.0)
            return tf.cast(tf.equal(tf.cast(positive, labels.dtype), labels), tf.float32)
        return tf.cast(tf.equal(tf.argmax(outputs, -1), labels), tf.float32)

    def _gradients(self, images, labels, weights=None):
        """Gradients of the (loss-scaled) global-batch loss share, summed over micro-batches; ``weights``: the
        batch's sample weights (None: each example counts once)."""
        config = self.config
        variables = self.model.trainable_variables
        num_replicas = self.placement.num_replicas
        k = config.grad_accum_steps
        if weights is None:
            weights = tf.ones(tf.shape(labels)[:1], tf.float32)
        # One micro-batch: the batch itself, no split nor zero-initialized sums (fewer kernels per step).
        micro = zip(*(tf.split(t, k) for t in (images, labels, weights))) if k > 1 else [(images, labels, weights)]
        grads = loss_sum = correct = None
        predictions = []
        for i, (x, y, sample_weight) in enumerate(micro):
            with tf.GradientTape() as tape:
                outputs = self._forward(x, training=True)
                loss_weight = (sample_weight if self._class_weights is None
                               else sample_weight * tf.gather(self._class_weights, y))
                summed = tf.reduce_sum(self.per_example_loss(y, outputs) * loss_weight)
                loss = summed / config.global_batch_size
                if i == 0:  # the L2 term counts once per step
                    loss += optimizers.l2_penalty(self.optimization, variables, num_replicas)
                    if self.compiled and self.compiled.compiled and self.model.losses:  # as Keras adds them
                        regularization = tf.add_n([tf.cast(v, tf.float32) for v in self.model.losses]) / num_replicas
                        loss += regularization
                        summed += regularization * config.global_batch_size
                scaled = precision.scale_loss(self.optimizer, loss)
            micro_grads = [tf.cast(m, v.dtype) for m, v in zip(tape.gradient(scaled, variables), variables)]
            grads = micro_grads if grads is None else [g + m for g, m in zip(grads, micro_grads)]
            hits = tf.reduce_sum(self.per_example_accuracy(y, tf.cast(outputs, tf.float32)) * sample_weight)
            loss_sum, correct = (summed, hits) if i == 0 else (loss_sum + summed, correct + hits)
            if self._metrics is not None:
                predictions.append(tf.cast(outputs, tf.float32))
        outputs = (predictions[0] if len(predictions) == 1 else tf.concat(predictions, 0)) if predictions else None
        return grads, loss_sum / config.global_batch_size, correct / config.global_batch_size, outputs

    def _metric_update(self, kind: str, labels, outputs, mask=None, sample_weight=None):
        """Adds this replica's batch to the compiled metrics' summed state: the labels as the user gave them
        (class indices or one-hot rows) and the model's output as the user's model gives it (probabilities under
        a softmax head, else its logits)."""
        if self._binary:
            truth = tf.cast(labels, tf.float32)[:, None]
            predicted = tf.sigmoid(outputs) if self.head.gives_probabilities and not self._from_probabilities \
                else outputs
            return self._metrics.add(kind, self._metrics.increments(truth, predicted, mask, sample_weight))
        truth = tf.one_hot(labels, self.info.num_classes) if self.compiled.one_hot else labels
        predicted = tf.nn.softmax(outputs) if self.head.gives_probabilities and not self._from_probabilities \
            else outputs
        return self._metrics.add(kind, self._metrics.increments(truth, predicted, mask, sample_weight))

    def train_step(self, batch):
        images, labels, weights = unpack_batch(batch)
        if weights is not None:  # tfgpu.fit's sample weights (fit_weights), as carried by the pipeline
            weights, _ = fit_weights.decode(weights)
        state = self.model.non_trainable_variables  # BatchNorm statistics: a skipped step puts them back
        saved = [tf.identity(v.value) for v in state]
        grads, loss, accuracy, outputs = self._grads_fn(images, labels, weights)
        if self._metrics is not None:
            self._metric_update("train", labels, outputs, sample_weight=weights)
        num_replicas = self.placement.num_replicas
        if self._clipping:  # a compiled clipnorm/clipvalue/global_clipnorm, on the all-reduced gradient
            grads = fit_compile.clip(grads, self._clipping, precision.current_loss_scale(self.optimizer),
                                     num_replicas)
        finite, norm = precision.apply_if_finite(self.optimizer, loss, grads, self.model.trainable_variables,
                                                 self.config.grad_clip_norm, num_replicas)
        precision.restore_if_not_finite(finite, state, saved)
        metrics = {"loss": loss, "accuracy": accuracy}
        if norm is not None:
            metrics["grad_norm"] = norm / num_replicas
        metrics["nonfinite_steps"] = tf.cast(tf.logical_not(finite), tf.float32) / num_replicas
        return metrics

    def eval_metric_names(self):
        return ("loss_sum", "correct", "correct_top5", "count", "weight_sum")

    def eval_step(self, batch):
        images, labels, carried = unpack_batch(batch)
        weights, real = fit_weights.decode(carried)  # padding: weight 0, not real; a weighted example's weight
        outputs = tf.cast(self._forward(images, training=False), tf.float32)
        loss = self.per_example_loss(labels, outputs)
        top1 = self.per_example_accuracy(labels, outputs)
        if self._binary:  # two classes: the top 5 hold both
            top5 = tf.ones_like(top1)
        else:
            top5 = tf.cast(tf.nn.in_top_k(labels, outputs, min(5, self.info.num_classes)), tf.float32)
        if self._metrics is not None:
            self._metric_update("eval", labels, outputs, mask=real, sample_weight=weights)
        # val_loss as Keras reduces it: sum(loss * weight) over the examples divided by their number; the
        # accuracies are weighted means
        return {"loss_sum": tf.reduce_sum(loss * weights), "correct": tf.reduce_sum(top1 * weights),
                "correct_top5": tf.reduce_sum(top5 * weights), "count": tf.reduce_sum(real),
                "weight_sum": tf.reduce_sum(weights)}

    def evaluate(self, run_eval, step, model_dir):
        if step == self.total_steps and (note := batch_norm.stale_statistics_note(
                self.model, step * self.config.grad_accum_steps)):
            log.warning("%s", note)
        if self._metrics is not None:
            self._metrics.reset("eval")
        sums = run_eval()
        count, weight = max(sums["count"], 1.0), sums["weight_sum"] or 1.0
        metrics = {"val_loss": sums["loss_sum"] / count, "val_accuracy": sums["correct"] / weight,
                   "val_top5_accuracy": sums["correct_top5"] / weight, "val_examples": int(sums["count"])}
        if self._metrics is not None:  # tfgpu.fit's compiled metrics, under History's names
            metrics.update(self._metrics.results("eval", "val_"))
        return metrics

    def learning_rates(self):
        return {"learning_rate": float(self._learning_rate_now())}

    def loss_scales(self):
        if self.config.precision == "mixed_float16":
            return {"loss_scale": float(precision.current_loss_scale(self.optimizer))}
        return {}

    def model_facts(self):
        if self._binary:
            return {"model_output": "probabilities" if self.head.gives_probabilities else "logits",
                    "loss_from": "probabilities" if self._from_probabilities else "logits", "output_units": "1",
                    "output_meaning": "one value per image: the probability of class 1 (the model ends in a "
                                      "sigmoid)" if self.head.gives_probabilities else
                                      "one logit per image: a sigmoid of it gives the probability of class 1"}
        return {"model_output": "probabilities" if self.head.gives_probabilities else "logits",
                "loss_from": ("probabilities" if self._from_probabilities else
                              "pre_softmax_logits" if self.head.gives_probabilities else "logits")}

    def describe(self):
        trainable = count_params(self.model)
        frozen = f" ({trainable:,} trainable)" if trainable != self.num_parameters else ""
        return f"model={self.config.model} params={self.num_parameters:,}{frozen} input={self.info.image_shape}"

    export_variants = {
        "": "takes images as pixels 0..255 (uint8 or float32); the run's --input_range mapping is inside it",
        "bare": "the network alone: takes float32 images already in --input_range",
    }

    def deployable(self, variant=""):
        """The trained classifier as users deploy it: rebuilt under the float32 policy with the trained weights, so
        it loads in any process whatever the run's precision (a model saved under a mixed policy records it per
        layer, and a user's layer may then fail to rebuild); by default with the pixel mapping of
        --input_range in front (``variant="bare"``: without it)."""
        with precision.float32_policy():
            model = self._float32_model()
            if variant == "bare":
                return model
            low, high = (float(v) for v in self.config.input_range)
            pixels = keras.Input(tuple(self.info.image_shape), dtype="float32", name="pixels")
            scaled = keras.layers.Rescaling(scale=(high - low) / 255.0, offset=low,
                                            name="pixels_to_input_range")(pixels)
            return keras.Model(pixels, model(scaled), name=f"{model.name}_pixels")

    def _float32_model(self):
        """``self.model`` when it is float32 already, else the same builder (under the float32 policy the caller
        set) with its weights: a mixed policy keeps every variable in float32, so they carry over as they are."""
        if all(layer.compute_dtype == "float32" for layer in self.model._flatten_layers()):
            return self.model
        twin = create_model(self.config.model, self.info.image_shape, self.info.num_classes,
                            output=self.model_output, **model_options(self.config))
        twin.set_weights(self.model.get_weights())
        return twin
