"""Each task's eval metrics that --target may name, known without importing the task (and with it TensorFlow): a
mistyped metric is then one line in well under a second (``config_sources.check_names``). The trainer checks the
task's own declarations again (``training.target.resolve``); tests/tasks/test_eval_metrics.py checks this table
against them, so a task's new metric is added here too. A task not listed is checked by the trainer alone."""

EVAL_METRICS = {
    "classification": ("val_loss", "val_accuracy", "val_top5_accuracy"),
    "multilabel": ("val_loss", "val_accuracy", "val_exact_match", "val_f1"),
    "gan": ("fid", "kid"),
}
