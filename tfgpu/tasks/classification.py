"""Image classification: softmax cross-entropy over a registered classifier.

Losses are summed over the replica's examples and divided by the global batch,
so the optimizer's all-reduce (a sum) yields the mean gradient of the global
batch whatever the replica count. With --grad_accum_steps=k each replica's
batch is cut into k micro-batches whose gradients are summed before one update. The step itself is
``classifier_model.ClassifierStep``, defined once: this task's replica steps call it for the flag command's
loop, and ``keras_model()`` gives it as the ``train_step``/``test_step`` of a Keras model ``tfgpu.fit`` runs.

Fine-tuning: --init_weights loads a local Keras weights file into the built model (``models.weights``)
when no checkpoint was restored; --freeze keeps the matching layers out of training (``models.freeze``)
until --unfreeze_at_step, where the trainer stops a loop and the step is traced again over every variable.
The optimizer is built over all variables before freezing, so its slots and the checkpoint are the same
frozen or not, and a resume on either side of the unfreeze step is exact.

A model that ends in a softmax gives probabilities (``tfgpu.models.heads``): the loss is computed from the logits
that softmax takes (the same layers and weights, ``Head.logits``), or, where the softmax cannot be separated from
its layer (a subclassed model), from the probabilities in float32, clipped at ``classifier_head.PROBABILITY_FLOOR``. A sigmoid
head is refused: it scores each class on its own, which one softmax over the classes does not train. A model whose
first layer is ``Rescaling(1/255)`` (it expects 0..255 pixels) is refused unless --input_range=0,255.
"""
import dataclasses
import logging

import keras
import tensorflow as tf

from tfgpu.config import InputConfig, OptimizationConfig, PrecisionConfig
from tfgpu.runtime import precision
from tfgpu.tasks import optimizers
from tfgpu.metrics import results
from tfgpu.models import batch_norm, create_model, get_spec, heads, model_options, random_states
from tfgpu.models.summary import count_params
from tfgpu.tasks.base import MetricSpec, Task, register_task, unpack_batch
from tfgpu.tasks.classifier_model import ClassifierStep, ClassifierTraining, SoftmaxScoring
from tfgpu.tasks.classifier_head import check_model

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
    report_options = ("jit_compile", "optimizer", "base_learning_rate", "lr_schedule", "warmup_epochs", "warmup_steps",
                      "weight_decay", "label_smoothing", "grad_accum_steps", "init_weights", "freeze")

    def build(self):
        config = self.config
        if get_spec(config.model).family != "classifier":
            raise ValueError(f"--model={config.model} is not a classifier; use --task=gan")
        self.model = create_model(config.model, self.info.image_shape, self.info.num_classes,
                                  output=self.model_output, **model_options(config))
        self.head = self.check_head(self.model)
        # What the loss is computed from: the model's logits, or the logits its softmax takes, or its probabilities.
        self._from_probabilities = self.head.gives_probabilities and self.head.logits is None
        from tfgpu.data.input.pipeline import steps_per_epoch
        from tfgpu.models.freeze import Freezer
        self.freezer = Freezer(self.model, config.freeze) if config.freeze else None
        self.num_parameters = count_params(self.model)

        optimization = self.optimization = OptimizationConfig.of(config)
        inputs = InputConfig.of(config, self.batches_per_step(config))
        self.schedule = optimizers.learning_rate_schedule(optimization, self.total_steps,
                                                          steps_per_epoch(inputs, self.info), inputs.examples_per_step,
                                                          self.resumed_examples)
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
        # The step both doors run: this task's replica steps and the Keras model of keras_model().
        self.step = ClassifierStep(self.model, self.optimizer, self.scoring(), forward=self.head.logits,
                                   global_batch_size=config.global_batch_size,
                                   grad_accum_steps=config.grad_accum_steps,
                                   l2=optimizers.l2_coefficient(optimization), grad_clip_norm=config.grad_clip_norm,
                                   jit_compile=self.jit_compile)
        self._keras_model = None

    def check_head(self, model) -> heads.Head:
        """The head of the built model, once this task can train it (``check_model``); ConfigError otherwise."""
        return check_model(model, self.config.model, self.info.num_classes, self.config.input_range)

    def scoring(self) -> SoftmaxScoring:
        """How the outputs are scored (loss, accuracy, the evaluation's extras): one softmax over the classes."""
        return SoftmaxScoring(self.info.num_classes, self.config.label_smoothing, self._from_probabilities)

    def keras_model(self) -> ClassifierTraining:
        """The model in training as a ``keras.Model`` whose ``train_step``/``test_step`` are this task's step and
        which advances the run's step counter (``classifier_model.ClassifierTraining``), made once, in the strategy's
        scope. It wraps ``self.model`` (what is checkpointed and exported) and ``self.optimizer``."""
        if self._keras_model is None:
            with self.placement.strategy.scope():
                self._keras_model = ClassifierTraining(self.step, self.global_step, name=f"{self.model.name}_training")
        return self._keras_model

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
        self.step.retrace()
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
        return {"model": self.model, "optimizer": self.optimizer, **random_states.items(self.model)}

    def train_step(self, batch):
        return self.step.train_shares(batch)

    def eval_metric_names(self):
        return ("loss_sum", "correct", "correct_top5", "count", "weight_sum")

    def eval_step(self, batch):
        images, labels, carried = unpack_batch(batch)
        weights = real = tf.cast(carried, tf.float32)  # the eval pipeline's padding weighs 0
        _, values = self.step.eval_values(images, labels)
        # val_loss as Keras reduces it: sum(loss * weight) over the examples divided by their number; the
        # accuracies are weighted means
        return {"loss_sum": tf.reduce_sum(values["loss"] * weights),
                "correct": tf.reduce_sum(values["accuracy"] * weights),
                "correct_top5": tf.reduce_sum(values["top5_accuracy"] * weights), "count": tf.reduce_sum(real),
                "weight_sum": tf.reduce_sum(weights)}

    def evaluate(self, run_eval, step, model_dir):
        if step == self.total_steps and (note := batch_norm.stale_statistics_note(
                self.model, step * self.config.grad_accum_steps)):
            log.warning("%s", note)
        sums = run_eval()
        count, weight = max(sums["count"], 1.0), sums["weight_sum"] or 1.0
        metrics = {"val_loss": sums["loss_sum"] / count, "val_accuracy": sums["correct"] / weight,
                   "val_top5_accuracy": sums["correct_top5"] / weight, "val_examples": int(sums["count"])}
        return metrics

    def learning_rates(self):
        return {"learning_rate": float(self._learning_rate_now())}

    def loss_scales(self):
        if self.config.precision == "mixed_float16":
            return {"loss_scale": float(precision.current_loss_scale(self.optimizer))}
        return {}

    def model_facts(self):
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
