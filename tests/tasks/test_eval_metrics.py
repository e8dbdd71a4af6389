"""tfgpu.tasks.eval_metrics: the metrics --target may name, known before TensorFlow is imported, are each task's."""
import pytest

from tfgpu.tasks.eval_metrics import EVAL_METRICS


@pytest.mark.parametrize("task", sorted(EVAL_METRICS))
def test_each_task_s_listed_metrics_are_those_its_declarations_give(task):
    from tfgpu.tasks.registry import get_task
    from tfgpu.metrics import metric_specs, target

    assert tuple(target.eval_metrics(metric_specs.of_task(get_task(task)))) == EVAL_METRICS[task]


def test_every_task_tfgpu_ships_is_listed():
    from tfgpu.tasks import TASK_MODULES
    from tfgpu.tasks.registry import get_task

    from tfgpu.tasks.base import _TASKS

    get_task("classification")  # imports every task module

    assert {name for name, cls in _TASKS.items() if cls.__module__ in TASK_MODULES} == set(EVAL_METRICS)
