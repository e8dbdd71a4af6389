"""The default LoopHooks adds nothing to the loop: no boundary, no evaluation, never a stop."""
from tfgpu.training import trainer
from tfgpu.training.hooks import LoopHooks


def test_the_default_hooks_add_no_boundary_no_evaluation_and_never_stop():
    hooks = LoopHooks()
    assert hooks.boundaries() == () and hooks.evaluations() == ()
    hooks.on_train_begin(0)
    assert hooks.on_loop_end(10, 10, {"loss": 1.0}) is False
    assert hooks.on_boundary(10, {"val_accuracy": 0.5}) is False
    assert hooks.on_train_end(20, {}) is None


def test_the_trainer_uses_the_hooks_class():
    assert trainer.LoopHooks is LoopHooks
