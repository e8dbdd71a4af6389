"""Mixed precision and XLA: runs train, logits stay float32, the float16 loss scale adapts, XLA compiles."""
import os

import pytest

from tests.conftest import read_history

SMALL = ["--dataset=digits", "--model=small_cnn", "--global_batch_size=32", "--eval_split=none", "--verbose=2",
         "--base_learning_rate=0.8", "--lr_schedule=constant"]


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_with_float32_logits(precision, run_train, tmp_path):
    run_train(*SMALL, f"--precision={precision}", "--train_steps=40", "--steps_per_loop=10",
              f"--model_dir={tmp_path}")
    losses = [r["loss"] for r in read_history(tmp_path)]
    assert losses[-1] < 0.7 * losses[0], losses
    import keras

    model = keras.saving.load_model(tmp_path / "export" / "model.keras")
    assert model.layers[-2].compute_dtype == {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[precision]
    import numpy as np

    logits = model(np.zeros((2, 8, 8, 1), np.float32))
    assert str(logits.dtype) in ("float32", "<dtype: 'float32'>")


def test_float16_loss_scale_backs_off_and_grows(run_train, tmp_path):
    """A scale of 2^24 overflows float16 gradients: it halves on each skipped step, then doubles every
    --loss_scale_growth_steps finite steps."""
    run_train(*SMALL, "--precision=mixed_float16", "--initial_loss_scale=16777216", "--loss_scale_growth_steps=5",
              "--train_steps=40", "--steps_per_loop=5", f"--model_dir={tmp_path}")
    history = read_history(tmp_path)
    scales = [r["loss_scale"] for r in history]
    low = scales.index(min(scales))
    assert min(scales) < 16777216 and sum(r["nonfinite_steps"] for r in history) >= 1
    assert max(scales[low:]) > min(scales), scales
    assert history[-1]["loss"] < history[0]["loss"]


def test_jit_compile_takes_effect(run_train, tmp_path):
    """With --jit_compile XLA really compiles the replica step (it dumps the HLO modules it builds)."""
    dump = tmp_path / "xla"
    run_train(*SMALL, "--jit_compile", "--train_steps=2", "--steps_per_loop=2", f"--model_dir={tmp_path / 'run'}",
              env={"XLA_FLAGS": f"--xla_dump_to={dump}"})
    modules = [f for f in os.listdir(dump) if "gradients" in f and f.endswith(".txt")]
    assert modules, sorted(os.listdir(dump))[:20]


def test_jit_compile_is_turned_off_with_a_warning_on_logical_cpus(run_train, tmp_path):
    proc = run_train(*SMALL, "--jit_compile", "--cpu_logical_devices=2", "--train_steps=2", "--steps_per_loop=2",
                     f"--model_dir={tmp_path}")
    assert "--jit_compile is off for this run" in proc.output
