"""Multi-label image classification: any number of labels per image, one sigmoid per label.

A record holds its image as classification's do and, under ``image/class/label``, a vector of 0/1 values, one
per label; the manifest's ``classes`` name the labels. Each vector is checked as it is parsed (its length, its
values): a bad one stops the run in one line naming the shard and record. The loss is the binary cross-entropy
of each label's logit, averaged over the labels of an example and shared out over the global batch as
classification's is (micro-batches, clipping, the non-finite guard and fine-tuning are classification's, which
this task extends). Logged: the loss and the per-label (binary) accuracy while training; at evaluation also the
exact match (every label right) and the micro-averaged F1 over all labels. The model gives one logit per label;
the export says so (a sigmoid gives each label's probability).

Data that ships in a package: ``write_digits`` converts scikit-learn's 1,797 handwritten digits (8x8, the same
80/20 split as ``--dataset=digits``) into a multi-label dataset whose labels are facts about the digit, not
annotations of the image: ``DIGIT_LABELS`` (even; 5 or more; prime; a closed loop in its usual printed form,
0 6 8 9, 4 counted as open). ``python -m tfgpu.tasks.multilabel --output_dir=DIR`` writes it; train with
``--task=multilabel --data_dir=DIR``.
"""
import argparse
import dataclasses
import os

import numpy as np
import tensorflow as tf

from tfgpu.config import ConfigError, InputConfig
from tfgpu.data.input import records
from tfgpu.data.schema import tfrecord
from tfgpu.models import heads
from tfgpu.runtime import fileio
from tfgpu.tasks.base import MetricSpec, register_task, unpack_batch
from tfgpu.tasks.classification import ClassificationTask
from tfgpu.tasks.classifier_head import check_input_range

DIGIT_LABELS = {
    "even": lambda d: d % 2 == 0,
    "at_least_5": lambda d: d >= 5,
    "prime": lambda d: d in (2, 3, 5, 7),
    "closed_loop": lambda d: d in (0, 6, 8, 9),
}


class MultiLabelExamples(records.Examples):
    """Classification's image; the target is the record's vector of 0/1 values, one per label, checked as parsed
    (two comparisons per value; the words of the error line are made only for a bad record)."""

    def feature_spec(self):
        return {**tfrecord.FEATURE_SPEC, tfrecord.LABEL: tf.io.VarLenFeature(tf.int64)}

    def label(self, features, split, key):
        n = self.info.num_classes
        values = features[tfrecord.LABEL].values
        ok = tf.logical_and(tf.equal(tf.size(values), n), tf.reduce_all(tf.logical_and(values >= 0, values <= 1)))
        problem = tf.cond(ok, lambda: tf.constant(""), lambda: tf.strings.join([  # the words only for a bad one
            "has label values (", tf.strings.reduce_join(tf.strings.as_string(values), separator=","),
            f") under {tfrecord.LABEL!r}; --task=multilabel needs {n} values of 0 or 1, one per label of the "
            "manifest's classes"]))
        # n values whatever the record holds (a wrong count stops the step at the check, not at a shape error).
        fixed = tf.reshape(tf.concat([values, tf.zeros([n], tf.int64)], 0)[:n], [n])
        return records.checked(fixed, ok, split, key, problem)

    def synthetic_labels(self, rng, count):
        return rng.integers(0, 2, (count, self.info.num_classes)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class SigmoidScoring:
    """How a multi-label model's logits are scored (``classifier_model.ClassifierStep``'s scoring): each example's
    binary cross-entropy averaged over its labels (each target smoothed toward 0.5 by ``label_smoothing``), the share
    of its labels right, and at evaluation whether every label is right (``exact_match``)."""
    label_smoothing: float = 0.0
    extra_names = ("exact_match",)

    def loss(self, labels, outputs):
        targets = tf.cast(labels, tf.float32)
        if self.label_smoothing:
            targets = targets * (1.0 - self.label_smoothing) + 0.5 * self.label_smoothing
        losses = tf.nn.sigmoid_cross_entropy_with_logits(targets, tf.cast(outputs, tf.float32))
        return tf.reduce_mean(losses, -1)

    def accuracy(self, labels, outputs):
        return tf.reduce_mean(_right(labels, outputs), -1)

    def eval_extras(self, labels, outputs) -> dict:
        return {"exact_match": tf.reduce_min(_right(labels, outputs), -1)}


def _right(labels, logits):
    """1 where a label's logit is on the side of 0 its 0/1 value is, per label."""
    return tf.cast(tf.equal(tf.cast(logits > 0, tf.int64), tf.cast(labels, tf.int64)), tf.float32)


def _classification_specs(*names):
    """Classification's declarations of ``names``, in that order."""
    by_name = {spec.name: spec for spec in ClassificationTask.metrics}
    return tuple(by_name[name] for name in names)


@register_task("multilabel")
class MultiLabelTask(ClassificationTask):
    metrics = (
        *_classification_specs("loss", "val_loss"),
        MetricSpec("accuracy", lower_is_better=False, plot="accuracy", title="Accuracy", panel="accuracy",
                   label="train, per label", progress=True),
        MetricSpec("val_accuracy", kind="eval", lower_is_better=False, plot="accuracy", panel="accuracy",
                   label="eval, per label"),
        MetricSpec("val_exact_match", kind="eval", lower_is_better=False, plot="accuracy", panel="accuracy",
                   label="eval, every label right"),
        MetricSpec("val_f1", kind="eval", lower_is_better=False, plot="accuracy", panel="accuracy",
                   label="eval micro-F1"),
        *_classification_specs("val_examples", "grad_norm", "nonfinite_steps", "learning_rate", "loss_scale"),
    )

    def examples(self):
        return MultiLabelExamples(InputConfig.of(self.config, self.batches_per_step(self.config)), self.info)

    def model_output(self):
        n = self.info.num_classes
        return (n,), f"a multi-label model of {n} labels must give one logit per label, shape (batch, {n})"

    def check_head(self, model):
        """The model's head: logits, or a sigmoid whose logits can be taken from under it; ConfigError else."""
        head = heads.output_head(model)
        if head.gives_probabilities and (head.activation != "sigmoid" or head.logits is None):
            why = ("which makes the labels compete for one unit of probability" if head.activation == "softmax"
                   else "whose logits cannot be separated from the layer")
            raise ConfigError("model", f"{self.config.model} ends in a {head.activation} (layer {head.layer!r}), "
                              f"{why}; --task=multilabel trains one sigmoid per label from logits: remove the "
                              "activation (activation=None)")
        check_input_range(model, self.config.model, self.config.input_range)
        return head

    def scoring(self):
        return SigmoidScoring(self.config.label_smoothing)

    def eval_metric_names(self):
        return ("loss_sum", "right", "exact", "true_positives", "predicted", "actual", "count")

    def eval_step(self, batch):
        images, labels, weights = unpack_batch(batch)
        logits, values = self.step.eval_values(images, labels)
        predicted, actual = tf.cast(logits > 0, tf.float32), tf.cast(labels, tf.float32)
        per_label = weights[:, None]
        return {"loss_sum": tf.reduce_sum(values["loss"] * weights),
                "right": tf.reduce_sum(values["accuracy"] * weights),
                "exact": tf.reduce_sum(values["exact_match"] * weights),
                "true_positives": tf.reduce_sum(predicted * actual * per_label),
                "predicted": tf.reduce_sum(predicted * per_label), "actual": tf.reduce_sum(actual * per_label),
                "count": tf.reduce_sum(weights)}

    def evaluate(self, run_eval, step, model_dir):
        sums = run_eval()
        count = max(sums["count"], 1.0)
        return {"val_loss": sums["loss_sum"] / count, "val_accuracy": sums["right"] / count,
                "val_exact_match": sums["exact"] / count,
                "val_f1": 2 * sums["true_positives"] / max(sums["predicted"] + sums["actual"], 1.0),
                "val_examples": int(sums["count"])}

    def model_facts(self):
        if self.head.gives_probabilities:
            return {"model_output": "probabilities", "loss_from": "pre_sigmoid_logits",
                    "output_meaning": "probabilities, one per label, each on its own (the model ends in a sigmoid)"}
        return {"model_output": "logits", "loss_from": "logits",
                "output_meaning": "logits, one per label (a sigmoid of each gives that label's probability)"}


def digit_labels(digits) -> np.ndarray:
    """The 0/1 vector of ``DIGIT_LABELS`` for each digit 0..9 in ``digits``."""
    return np.array([[int(rule(int(d))) for rule in DIGIT_LABELS.values()] for d in digits], np.int64)


def write_digits(directory: str, num_shards: int = 2) -> str:
    """Writes scikit-learn's digits, labelled by ``DIGIT_LABELS``, as a converted dataset in ``directory``
    (train/val as ``--dataset=digits`` splits them; PNG records; ``dataset.json`` last); returns ``directory``."""
    from tfgpu.data.sources.builtin import load_builtin

    data = load_builtin("digits")
    fileio.makedirs(directory)
    splits = {}
    for split, (images, digits) in data["splits"].items():
        labels = digit_labels(digits)
        bounds = np.linspace(0, len(images), num_shards + 1).astype(int)
        shards = []
        for s in range(num_shards):
            shard_records = (tfrecord.make_example(tfrecord.encode_image(images[i], "png"), "png", labels[i],
                                                   *images[i].shape, filename=f"{split}/{i}")
                             for i in range(bounds[s], bounds[s + 1]))
            path = os.path.join(directory, tfrecord.shard_name(split, s, num_shards))
            shards.append(tfrecord.write_shard(path, shard_records))
        splits[split] = {"num_examples": len(images), "shards": shards,
                         "label_counts": dict(zip(DIGIT_LABELS, labels.sum(0).tolist()))}
    h, w, c = data["splits"]["train"][0].shape[1:]
    tfrecord.write_manifest(directory, {
        "name": "digits_multilabel", "classes": list(DIGIT_LABELS), "splits": splits,
        "image_shape": {"height": h, "width": w, "channels": c},
        "labels_from": "scikit-learn load_digits: each label is a fact about the digit (tfgpu.tasks.multilabel)"})
    return directory


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfgpu.tasks.multilabel",
                                     description="Write scikit-learn's digits as a multi-label dataset.")
    parser.add_argument("--output_dir", required=True)
    print(write_digits(parser.parse_args(argv).output_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
