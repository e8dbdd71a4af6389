"""The classification step, defined once: what one replica computes (``ClassifierStep``) and the ``keras.Model`` whose
``train_step``/``test_step`` it is (``ClassifierTraining``), which ``model.fit`` and ``tfgpu.fit`` run.

The flag command's ``ClassificationTask`` (and ``MultiLabelTask``) builds one ``ClassifierStep`` and its replica steps
call it (shares and sums for ``training/loop.build_loop``); ``ClassifierTraining``'s steps call the same object and hand
its shares to Keras through ``share_logs.ShareLogs``. A train step: the loss of the network's logits (under a softmax
head, the logits it takes: ``classifier_head``), times each example's sample weight, summed over the replica's examples
and divided by the global batch; --grad_accum_steps micro-batches whose gradients are summed before one update; the L2
term once a step; the forward and backward pass compiled by XLA when asked (the all-reduce and the update stay outside
it); global-norm clipping of the all-reduced gradient; the non-finite guard (``precision.apply_if_finite``: a step with
a non-finite loss or gradient on any replica changes no weight, slot nor BatchNorm statistic and is counted). The
network stays the model that is checkpointed and exported; ``ClassifierTraining`` only drives it.
"""
import dataclasses

import keras
import tensorflow as tf

from tfgpu.runtime import precision
from tfgpu.tasks import classifier_head, optimizers
from tfgpu.tasks.base import unpack_batch
from tfgpu.tasks.share_logs import ShareLogs


@dataclasses.dataclass(frozen=True)
class SoftmaxScoring:
    """How a classifier of ``num_classes`` is scored from its outputs: each example's cross-entropy (smoothed toward
    uniform by ``label_smoothing``; from probabilities when the softmax cannot be separated), whether its top-1 is
    right, and at evaluation whether the label is among its top 5 (``eval_extras``, named in ``extra_names``)."""
    num_classes: int
    label_smoothing: float = 0.0
    from_probabilities: bool = False
    extra_names = ("top5_accuracy",)

    def loss(self, labels, outputs):
        """Cross-entropy in float32 of ``outputs``: logits, or probabilities when the softmax is not separable."""
        return classifier_head.softmax_cross_entropy(labels, tf.cast(outputs, tf.float32), self.num_classes,
                                                     self.label_smoothing, self.from_probabilities)

    def accuracy(self, labels, outputs):
        """Each example's top-1 accuracy, 0 or 1."""
        return tf.cast(tf.equal(tf.argmax(outputs, -1), tf.cast(labels, tf.int64)), tf.float32)

    def eval_extras(self, labels, outputs) -> dict:
        top5 = tf.nn.in_top_k(tf.cast(labels, tf.int64), outputs, min(5, self.num_classes))
        return {"top5_accuracy": tf.cast(top5, tf.float32)}


class ClassifierStep:
    """One replica's classification step on ``network`` with ``optimizer`` (a ``precision.GuardedOptimizer``).

    ``scoring``: ``SoftmaxScoring`` or a task's own (``loss``, ``accuracy``, ``eval_extras`` of (labels, outputs),
    ``extra_names``); ``forward``: what the loss is computed from (default the network; the view giving the logits
    under its softmax); ``global_batch_size``: what a loss share is divided by (None: the replica's batch times the
    replicas, as Keras reduces a loss); ``l2``: the coefficient of the L2 term (``optimizers.l2_term``);
    ``grad_clip_norm``: the global gradient's norm is clipped to it and logged (0: neither); ``jit_compile``: XLA
    compiles the forward and backward pass. The number of replicas is the replica context's, read as a step is traced.
    """

    def __init__(self, network, optimizer, scoring, *, forward=None, global_batch_size=None, grad_accum_steps=1,
                 l2=0.0, grad_clip_norm=0.0, jit_compile=False):
        self.network, self.optimizer, self.scoring = network, optimizer, scoring
        self.forward = forward if forward is not None else network
        self.global_batch_size, self.grad_accum_steps = global_batch_size, int(grad_accum_steps)
        self.l2, self.grad_clip_norm, self.jit_compile = l2, grad_clip_norm, bool(jit_compile)
        self.retrace()

    def retrace(self) -> None:
        """A fresh gradient function: a traced one keeps the trainable variables it was traced with (call after
        freezing or unfreezing layers)."""
        # No autograph, as in the train loop (loop.build_loop): it converted the model's every call again inside
        # this nested function, about a fifth of the train loop's tracing (ResNet-20, cProfile).
        self._gradient_fn = (tf.function(self.gradients, jit_compile=True, autograph=False) if self.jit_compile
                             else self.gradients)

    @property
    def log_names(self) -> tuple:
        """The keys of ``train_shares``."""
        return ("loss", "accuracy") + (("grad_norm",) if self.grad_clip_norm else ()) + ("nonfinite_steps",)

    def gradients(self, images, labels, weights, num_replicas: int):
        """Gradients of the (loss-scaled) global-batch loss share, summed over micro-batches, with the shares of the
        loss and accuracy; ``weights``: the batch's sample weights (None: each example counts once)."""
        variables = self.network.trainable_variables
        k = self.grad_accum_steps
        global_batch = self.global_batch_size or tf.cast(tf.shape(labels)[0] * num_replicas, tf.float32)
        if weights is None:
            weights = tf.ones(tf.shape(labels)[:1], tf.float32)
        # One micro-batch: the batch itself, no split nor zero-initialized sums (fewer kernels per step).
        micro = zip(*(tf.split(t, k) for t in (images, labels, weights))) if k > 1 else [(images, labels, weights)]
        grads = loss_sum = correct = None
        for i, (x, y, sample_weight) in enumerate(micro):
            with tf.GradientTape() as tape:
                outputs = self.forward(x, training=True)
                summed = tf.reduce_sum(self.scoring.loss(y, outputs) * sample_weight)
                loss = summed / global_batch
                if i == 0:  # the L2 term counts once per step
                    loss += optimizers.l2_term(self.l2, variables, num_replicas)
                scaled = precision.scale_loss(self.optimizer, loss)
            micro_grads = [tf.cast(m, v.dtype) for m, v in zip(tape.gradient(scaled, variables), variables)]
            grads = micro_grads if grads is None else [g + m for g, m in zip(grads, micro_grads)]
            hits = tf.reduce_sum(self.scoring.accuracy(y, tf.cast(outputs, tf.float32)) * sample_weight)
            loss_sum, correct = (summed, hits) if i == 0 else (loss_sum + summed, correct + hits)
        return grads, loss_sum / global_batch, correct / global_batch

    def train_shares(self, batch) -> dict:
        """One optimizer step on this replica's batch (inside ``strategy.run``, or Keras' step on one device); returns
        this replica's shares of the step's ``log_names``. A skipped step puts the BatchNorm statistics back."""
        images, labels, weights = unpack_batch(batch)
        if weights is not None:
            weights = tf.cast(weights, tf.float32)
        num_replicas = tf.distribute.get_replica_context().num_replicas_in_sync
        state = self.network.non_trainable_variables
        saved = [tf.identity(v.value) for v in state]
        grads, loss, accuracy = self._gradient_fn(images, labels, weights, num_replicas)
        finite, norm = precision.apply_if_finite(self.optimizer, loss, grads, self.network.trainable_variables,
                                                 self.grad_clip_norm, num_replicas)
        precision.restore_if_not_finite(finite, state, saved)
        shares = {"loss": loss, "accuracy": accuracy}
        if norm is not None:
            shares["grad_norm"] = norm / num_replicas
        shares["nonfinite_steps"] = tf.cast(tf.logical_not(finite), tf.float32) / num_replicas
        return shares

    def eval_values(self, images, labels):
        """(outputs in float32, each example's ``loss``, ``accuracy`` and the scoring's ``eval_extras``), the network
        called for inference."""
        outputs = tf.cast(self.forward(images, training=False), tf.float32)
        return outputs, {"loss": self.scoring.loss(labels, outputs), "accuracy": self.scoring.accuracy(labels, outputs),
                         **self.scoring.eval_extras(labels, outputs)}


class _EvalLogs:
    """An evaluation's logs as Keras' own compiled loss and metrics give them: ``loss`` is sum(loss x weight) over the
    examples divided by their number, every other value a mean weighted by the sample weights. A plain holder, so the
    model tracks (and checkpoints) nothing of them."""

    def __init__(self, names):
        self.trackers = {name: keras.metrics.Mean(name=name) for name in names}

    def update(self, values: dict, weights) -> dict:
        for name, value in values.items():
            if name == "loss":
                self.trackers[name].update_state(value * weights)
            else:
                self.trackers[name].update_state(value, sample_weight=weights)
        return {name: tracker.result() for name, tracker in self.trackers.items()}


class ClassifierTraining(keras.Model):
    """A classifier in training as a Keras model: its ``train_step`` and ``test_step`` are ``step``'s (a
    ``ClassifierStep``), run by ``model.fit``/``evaluate`` and ``tfgpu.fit`` alike; calling it calls the network.

    Logs: the train step's ``loss``, ``accuracy`` (means over the epoch's steps), ``grad_norm`` when clipping,
    ``nonfinite_steps`` (the count of skipped steps); an evaluation's ``loss``, ``accuracy`` and the scoring's extras
    (``top5_accuracy``), as Keras weighs them. Compiled as it is made, with the step's optimizer and
    ``jit_compile=False``: the step compiles its own forward and backward pass with XLA when asked, and Keras' XLA over
    the whole step would take the all-reduce and the guarded update into it. ``step_counter``: a variable each train
    step advances by one, skipped or not (the flag command's step, which its learning-rate schedule follows). Make it
    inside the strategy's scope that is to run it.
    """

    def __init__(self, step: ClassifierStep, step_counter=None, **kwargs):
        super().__init__(**kwargs)
        self.step = step
        self.network = step.network
        self.step_counter = step_counter
        self.train_logs = ShareLogs(means=tuple(n for n in step.log_names if n != "nonfinite_steps"),
                                    counts=("nonfinite_steps",))
        self.eval_logs = _EvalLogs(("loss", "accuracy", *step.scoring.extra_names))
        self.compile(optimizer=step.optimizer, jit_compile=False)

    @property
    def metrics(self):
        return [*self.train_logs.trackers.values(), *self.eval_logs.trackers.values()]

    def call(self, inputs, training=False):
        return self.network(inputs, training=training)

    def train_step(self, data):
        shares = self.step.train_shares(data)
        if self.step_counter is not None:
            self.step_counter.assign_add(1)
        return self.train_logs.update(shares)

    def test_step(self, data):
        images, labels, weights = unpack_batch(data)
        _, values = self.step.eval_values(images, labels)
        weights = tf.ones_like(values["loss"]) if weights is None else tf.cast(weights, tf.float32)
        return self.eval_logs.update(values, weights)


def for_network(network, optimizer, *, num_classes=None, label_smoothing=0.0, weight_decay=0.0, grad_accum_steps=1,
                grad_clip_norm=0.0, jit_compile=False, **kwargs) -> ClassifierTraining:
    """``network`` (a classifier giving logits, or ending in a softmax) in training with ``optimizer`` behind the
    non-finite guard (``precision.guard``), as the flag command trains it: ``weight_decay`` as an L2 term in the loss (--weight_decay with sgd or adam),
    ``grad_accum_steps`` micro-batches (each replica's batch must divide by it), ``grad_clip_norm`` on the global
    gradient, ``jit_compile`` for the forward and backward pass. ``num_classes``: default the network's last output
    dimension. Make it inside the strategy's scope that is to run it; ``kwargs`` go to ``keras.Model``."""
    if num_classes is None:
        num_classes = int(network.outputs[0].shape[-1])
    head = classifier_head.softmax_head(network, network.name, num_classes)
    from_probabilities = head.gives_probabilities and head.logits is None
    step = ClassifierStep(network, precision.guard(optimizer),
                          SoftmaxScoring(num_classes, label_smoothing, from_probabilities),
                          forward=head.logits, grad_accum_steps=grad_accum_steps,
                          l2=weight_decay, grad_clip_norm=grad_clip_norm, jit_compile=jit_compile)
    return ClassifierTraining(step, **kwargs)
