"""experiment.setup's own decisions, in-process; whole runs are tests/test_train.py."""
import types

from tfgpu.config import Config, InputConfig
from tfgpu.training import experiment


def test_a_checkpoint_interval_in_epochs_or_examples_becomes_the_trainers_steps_and_eval_every_stays_a_duration():
    """1000 examples, 10 per step: 100 steps per epoch. --eval_every's steps depend on the data position the run
    resumes (an epoch ends where its records do), so the trainer places them after its restore."""
    config = Config(model_dir="unused", dataset="digits", global_batch_size=10, eval_every="2ep",
                    checkpoint_every="300ex")
    info = types.SimpleNamespace(num_train_examples=1000)
    section = experiment._trainer_config(config, InputConfig.of(config, batches_per_step=1), info)
    assert (section.eval_every, section.checkpoint_every_steps) == ("2ep", 30)
    older = Config(model_dir="unused", dataset="digits", eval_every_steps=7)
    section = experiment._trainer_config(older, InputConfig.of(older, batches_per_step=1), info)
    assert (section.eval_every, section.eval_every_steps, section.checkpoint_every_steps) == ("", 7, 1000)
    timed = Config(model_dir="unused", dataset="digits", checkpoint_every="5min")
    section = experiment._trainer_config(timed, InputConfig.of(timed, batches_per_step=1), info)
    assert (section.checkpoint_every_steps, section.checkpoint_every) == (0, "5min")  # the trainer's clock decides
