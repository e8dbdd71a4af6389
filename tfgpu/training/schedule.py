"""Where the trainer's compiled loops end: the steps it evaluates at, checkpoints at, profiles at, and the task's and
the caller's boundaries. Pure arithmetic over the run's options (no TensorFlow), so each rule is testable alone."""


def eval_steps(total_steps: int, every, asked, evaluates: bool, has_target: bool, epoch_ends) -> set:
    """Steps before the last at which the run evaluates: those ``asked`` (a caller's hooks) and ``every``'s
    (--eval_every's steps, ``durations.every``); with a target and neither, ``epoch_ends()``: the first step at or
    after each epoch's end (a callable, read only then). Empty for a run that does not evaluate."""
    if not evaluates:
        return set()
    asked = {s for s in asked if 0 < s < total_steps}
    if every:
        return asked | {s for s in every if 0 < s < total_steps}
    if asked:
        return asked
    if not has_target:
        return set()
    return {s for s in epoch_ends() if 0 < s < total_steps}


def boundaries(total_steps: int, evaluations, checkpoint_every_steps: int, profile_steps: str, *more) -> list:
    """The steps where a loop ends, ascending, the last being ``total_steps``: ``evaluations``, every
    --checkpoint_every_steps, --profile_steps' start and stop, and each of ``more`` (the task's, the hooks')."""
    marks = set(evaluations)
    if checkpoint_every_steps:
        marks.update(range(checkpoint_every_steps, total_steps, checkpoint_every_steps))
    if profile_steps:
        marks.update(int(s) for s in profile_steps.split(","))
    for extra in more:
        marks.update(extra)
    return sorted(m for m in marks if 0 < m < total_steps) + [total_steps]
