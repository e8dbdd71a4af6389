"""``LoopHooks``: what a caller adds to the trainer's loop (extra boundaries and evaluations, calls at each
loop and boundary, a stop); the default adds nothing."""


class LoopHooks:
    """What a caller adds to the loop: steps where a loop must end and steps to
    evaluate at, and calls at the start, after every loop, at every boundary before the last (True stops the run
    there, after a checkpoint) and at the end (with the final evaluation, {} when there was none). The default
    adds nothing; ``on_loop_end`` returning True makes the loop's end a boundary (where ``on_boundary`` may stop)."""

    def boundaries(self) -> tuple:
        return ()

    def evaluations(self) -> tuple:
        return ()

    def on_train_begin(self, step: int) -> None:
        pass

    def on_loop_end(self, step: int, num_steps: int, step_metrics: dict) -> bool:
        return False

    def on_boundary(self, step: int, eval_metrics: dict) -> bool:
        return False

    def on_train_end(self, step: int, eval_metrics: dict) -> None:
        pass
