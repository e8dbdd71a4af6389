"""The Task contract: a task declares its metrics, batches per step and evaluation, and the trainer and the report
follow the declarations. A third task, defined only here, trains through the real Trainer with no edit to
trainer.py or report.py; run in-process."""
import dataclasses
import json

import keras
import pytest
import tensorflow as tf

from tfgpu.runtime import failures
from tfgpu.training import experiment
from tfgpu.metrics import metric_specs
from tfgpu.config import Config
from tfgpu.tasks.base import MetricSpec, Task, register_task, unpack_batch
from tfgpu.tasks.registry import get_task, input_config


def toy_section(metrics, evals):
    """A declared report section: the report calls it with the run's metrics and eval records."""
    return ["## Toy regression", "", f"{len(evals)} evaluation(s) of the squared error.", ""]


@register_task("test_toy_regression")
class ToyRegression(Task):
    """Predicts a digit's label from its pixels with one Dense layer, on two global batches per step."""
    metrics = (
        MetricSpec("squared_error", lower_is_better=True, plot="toy_error", title="Toy error", panel="squared error",
                   label="train", progress=True),
        MetricSpec("val_squared_error", kind="eval", lower_is_better=True, plot="toy_error", panel="squared error",
                   label="eval"),
        MetricSpec("skipped", counts_nonfinite=True),
        MetricSpec("toy_learning_rate", plot="toy_learning_rate", title="Toy learning rate", panel="learning rate"),
    )
    report_sections = ("tests.tasks.test_base:toy_section",)
    report_options = ("momentum",)
    evaluates_without_eval_split = True  # scores a fixed batch, like the GAN's FID on the train split
    train_metric_names = ("squared_error", "skipped")
    skip_every_step = False

    @classmethod
    def batches_per_step(cls, config):
        return 2

    def build(self):
        self.model = keras.Sequential([keras.Input(self.info.image_shape), keras.layers.Flatten(),
                                       keras.layers.Dense(1)])
        self.optimizer = keras.optimizers.SGD(0.01)
        self.optimizer.build(self.model.trainable_variables)
        self.batch_shapes = []

    def train_step(self, batch):
        self.batch_shapes.append(len(batch))  # at trace time: the trainer hands the declared two batches
        images = tf.concat([tf.cast(b[0], tf.float32) for b in batch], 0)
        labels = tf.concat([tf.cast(b[1], tf.float32) for b in batch], 0)
        with tf.GradientTape() as tape:
            error = tf.reduce_sum(tf.square(self.model(images)[:, 0] - labels)) / (2 * self.config.global_batch_size)
        grads = tape.gradient(error, self.model.trainable_variables)
        skipped = tf.constant(1.0 if self.skip_every_step else 0.0)
        if not self.skip_every_step:
            self.optimizer.apply(grads, self.model.trainable_variables)
        return {"squared_error": error, "skipped": skipped / self.placement.num_replicas}

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def evaluate(self, run_eval, step, model_dir):
        images = tf.random.stateless_uniform((32, *self.info.image_shape), (1, 2), -1.0, 1.0)
        return {"val_squared_error": float(tf.reduce_mean(tf.square(self.model(images)[:, 0] - 4.5)))}

    def learning_rates(self):
        return {"toy_learning_rate": float(self.optimizer.learning_rate.numpy())}

    def deployable(self, variant=""):
        return self.model


@pytest.fixture
def toy(tmp_path, data_cache):
    yield Config(task="test_toy_regression", model_dir=str(tmp_path / "run"), dataset="digits",
                 data_cache_dir=data_cache, model="small_cnn", global_batch_size=16, train_steps=6, steps_per_loop=2,
                 eval_every_steps=2, checkpoint_every_steps=0, eval_split="none", tensorboard=False, verbose=2)
    keras.backend.clear_session(free_memory=False)


def _records(model_dir, kind):
    with open(f"{model_dir}/history.jsonl") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_a_third_task_trains_logs_and_reports_its_declared_metrics(report_plots, toy, capsys):
    assert input_config(toy).batches_per_step == 2 and input_config(toy).examples_per_step == 32  # the task's declaration
    final = experiment.run(toy)
    train, evals = _records(toy.model_dir, "train"), _records(toy.model_dir, "eval")
    assert [r["step"] for r in train] == [2, 4, 6]
    assert all({"squared_error", "skipped", "toy_learning_rate", "examples_per_sec"} <= r.keys() for r in train)
    assert all(r["skipped"] == 0 and isinstance(r["skipped"], int) for r in train)  # counted, not averaged
    assert train[-1]["squared_error"] < train[0]["squared_error"]
    # Evaluated every 2 steps without an eval split, because the task says it can.
    assert [r["step"] for r in evals] == [2, 4, 6] and all("val_squared_error" in r for r in evals)
    assert final["train_squared_error"] == pytest.approx(train[-1]["squared_error"])
    assert final["toy_learning_rate"] == pytest.approx(0.01) and "val_squared_error" in final
    assert "step 2/6 squared_error=" in capsys.readouterr().out  # declared progress
    declared = metric_specs.read(toy.model_dir)
    assert [s.name for s in declared.metrics][:4] == ["squared_error", "val_squared_error", "skipped",
                                                      "toy_learning_rate"]
    text = open(f"{toy.model_dir}/report.md").read()
    for plot, title in (("toy_error", "Toy error"), ("toy_learning_rate", "Toy learning rate"),
                        ("throughput", "Training throughput")):
        assert f"![{title}](plots/{plot}.png)" in text
    assert "| val_squared_error | " in text.split("## Best evaluation")[1]
    assert "3 evaluation(s) of the squared error." in text and "| momentum | 0.9 |" in text


def test_the_declared_nonfinite_count_stops_the_run(toy):
    """Skips are counted in whatever metric the task declares ``counts_nonfinite``."""
    task = get_task(toy.task)
    task.skip_every_step = True
    try:
        with pytest.raises(failures.NonFiniteError, match=r"^4 consecutive steps .* history.jsonl as skipped\)"):
            experiment.run(dataclasses.replace(toy, max_nonfinite_steps=4, eval_every_steps=0))
    finally:
        task.skip_every_step = False


def test_an_undeclared_train_metric_is_refused(toy):
    @register_task("test_toy_undeclared")
    class Undeclared(ToyRegression):
        train_metric_names = ("squared_error", "skipped", "surprise")

    with pytest.raises(ValueError, match="returns train metrics surprise that Undeclared.metrics does not declare"):
        experiment.run(dataclasses.replace(toy, task="test_toy_undeclared"))


def test_metric_declarations_round_trip_and_reject_nonsense():
    declared = metric_specs.of_task(get_task("classification"))
    assert metric_specs.from_json(json.loads(json.dumps(metric_specs.to_json(declared)))) == declared
    assert metric_specs.from_json({"metrics": [{"name": "a", "kind": "bogus"}, {"name": "b", "new_field": 1}]}) == \
        metric_specs.Declarations((MetricSpec("b"),))  # a file from another version gives what it can
    with pytest.raises(ValueError, match="'x' is plotted in 'p' but names no panel"):
        MetricSpec("x", plot="p")


def test_every_task_module_named_in_the_one_list_registers_and_the_list_imports_no_tensorflow():
    import subprocess
    import sys

    from tfgpu.tasks import TASK_MODULES, base

    light = subprocess.run([sys.executable, "-c", "import sys, tfgpu.tasks; assert 'tensorflow' not in sys.modules"],
                           capture_output=True, text=True)
    assert light.returncode == 0, light.stderr[-2000:]
    with pytest.raises(ValueError, match="unknown task 'segmentation'; known tasks: ") as error:
        get_task("segmentation")
    named = {name: cls.__module__ for name, cls in base._TASKS.items() if cls.__module__ in TASK_MODULES}
    assert set(TASK_MODULES) == set(named.values()) and {"classification", "gan"} <= named.keys()
    assert all(name in str(error.value) for name in named)


@pytest.mark.parametrize("batch, expected", [
    ("x", ("x", None, None)), (("x",), ("x", None, None)), (("x", "y"), ("x", "y", None)),
    (["x", "y", "w"], ("x", "y", "w")), ((("x1", "x2"), {"a": "y"}), (("x1", "x2"), {"a": "y"}, None)),
])
def test_a_batch_unpacks_as_keras_unpacks_it(batch, expected):
    assert unpack_batch(batch) == expected == tuple(keras.utils.unpack_x_y_sample_weight(batch))


def test_a_batch_of_four_parts_is_refused():
    with pytest.raises(ValueError, match=r"a batch is \(x, y, sample_weight\) at most, got a tuple of 4"):
        unpack_batch(("x", "y", "w", "z"))
