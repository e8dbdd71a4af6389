"""What a run measures and writes down, read by the loop, the tasks, the report and the plan alike: the metrics a
task declares (``metric_specs``), each loop's and evaluation's record (``history``: history.jsonl), the run's
outcome (``results``: metrics.json) and ``--target``. Above ``config`` and ``runtime/`` only, so the commands
that read a finished run need no training code."""
