"""metrics/metric_specs.py: which train metrics count skipped steps, and a train metric no declaration names."""
import types

import pytest

from tfgpu.metrics import metric_specs
from tfgpu.metrics.metric_specs import Declarations, MetricSpec

DECLARED = Declarations((MetricSpec("loss", lower_is_better=True),
                         MetricSpec("nonfinite_steps", counts_nonfinite=True)))


class Toy:
    name = "toy"


def test_only_declared_counting_metrics_count_skipped_steps_in_the_steps_order():
    assert metric_specs.counting_skips(DECLARED, ("loss", "nonfinite_steps"), Toy()) == ("nonfinite_steps",)
    assert metric_specs.counting_skips(DECLARED, ("loss",), types.SimpleNamespace(name="t")) == ()


def test_an_undeclared_train_metric_is_named_with_the_task_and_its_class():
    with pytest.raises(ValueError, match=r"^task 'toy' returns train metrics grad_norm that Toy.metrics does not "
                                         r"declare$"):
        metric_specs.counting_skips(DECLARED, ("loss", "grad_norm"), Toy())
