"""Where the trainer's compiled loops end: the steps it evaluates at, checkpoints at, profiles at, and the task's and
the caller's boundaries. Pure arithmetic over the run's options (no TensorFlow), so each rule is testable alone."""
import math


def eval_steps(total_steps: int, eval_every_steps: int, asked, evaluates: bool, has_target: bool,
               steps_per_epoch) -> set:
    """Steps before the last at which the run evaluates: those ``asked`` (a caller's hooks) and every
    --eval_every_steps; with a target and neither, the first step at or after each epoch's end (``steps_per_epoch``:
    a callable, read only then). None for a run that does not evaluate."""
    if not evaluates:
        return set()
    asked = {s for s in asked if 0 < s < total_steps}
    if eval_every_steps:
        return asked | set(range(eval_every_steps, total_steps, eval_every_steps))
    if asked:
        return asked
    if not has_target:
        return set()
    per_epoch = steps_per_epoch()
    ends = (math.ceil(k * per_epoch - 1e-9) for k in range(1, int(total_steps / per_epoch) + 1))
    return {s for s in ends if 0 < s < total_steps}


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
