"""The run directory: every file and folder name under ``--model_dir``, in one place, so renaming one is a
one-file change (as ``results.py`` owns metrics.json's content, this module owns where each file lives).

Each path is built with ``os.path.join``, as the writers and readers always did: it keeps ``gs://`` and
``ram://`` directories intact (``runtime/fileio.py`` opens them). This module imports nothing but ``os``, so
the launcher and the commands that load no TensorFlow can use it.

==========================  =========================================  ============================================
name under model_dir        written by                                 read by
==========================  =========================================  ============================================
config.yaml                 training/experiment.py (start of a run)    training/restore.py, training/config_change.py,
                                                                       reporting/report.py, report.py, plan.py
history.jsonl               metrics/history.py; runtime/supervisor.py reporting/report.py, plan.py,
                            (a failed group's line)                    tools/heal_trials.py
metrics.json                metrics/results.py                        metrics/results.py (its readers), plan.py,
                                                                       tools/heal_trials.py
metric_specs.json           metrics/metric_specs.py                   metrics/metric_specs.py (reporting)
model_source.json           models/provenance.py                       models/provenance.py
input_profile.json          training/input_profile.py                  reporting/report.py
report.md                   reporting/report.py                        the user
plots/<plot>.png            reporting/plots.py                         report.md
checkpoints/                training/checkpoint.py (TensorFlow's       training/checkpoint.py, training/trainer.py,
  ckpt-<step>.index/.data     CheckpointManager, prefix ``ckpt-``)     runtime/restarts.py (state file only),
  checkpoint (state file)                                              tools/stop_latency.py
summaries/train             training/trainer.py (TensorBoard)          TensorBoard
summaries/validation        training/trainer.py (TensorBoard)          TensorBoard
summaries/samples           tasks/gan/evaluation.py                    TensorBoard
profile/                    training/trainer.py (--profile_steps)      TensorBoard's profiler
export/model.keras          training/experiment.py, export.py,         tasks/gan/fid.py (a classifier for FID)
export/model.bare.keras       tasks/gan/fid.py                         tasks/gan/fid.py
export/saved_model          export.py (--format=saved_model)           TensorFlow Serving
samples/step_<N>.png        tasks/gan/evaluation.py                    report.md (metric ``samples``)
samples/sample_step<N>.png  sample.py                                  the user
eval-<split>-step<N>.json   evaluate.py                                the user
fid_features/               tasks/gan/evaluation.py                    tasks/gan/evaluation.py
.write-test-<pid>           training/experiment.py (a probe, removed)  -
==========================  =========================================  ============================================
"""
import os

CONFIG_FILE = "config.yaml"
HISTORY_FILE = "history.jsonl"
METRICS_FILE = "metrics.json"
METRIC_SPECS_FILE = "metric_specs.json"
MODEL_SOURCE_FILE = "model_source.json"
INPUT_PROFILE_FILE = "input_profile.json"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_NAME = "ckpt"  # TensorFlow's CheckpointManager names each checkpoint <name>-<step>
CHECKPOINT_PREFIX = CHECKPOINT_NAME + "-"
CHECKPOINT_STATE_FILE = "checkpoint"  # TensorFlow's own name for the file naming the latest checkpoint
SUMMARIES_DIR = "summaries"
PROFILE_DIR = "profile"
EXPORT_DIR = "export"
EXPORTED_MODEL = "model.keras"
EXPORTED_BARE_MODEL = "model.bare.keras"
EXPORTED_SAVED_MODEL = "saved_model"
SAMPLES_DIR = "samples"
FID_FEATURES_DIR = "fid_features"
EVALUATION_PREFIX = "eval-"
WRITE_PROBE = ".write-test-"


def config_yaml(model_dir: str) -> str:
    """The run's frozen Config as YAML; a rerun compares its flags with it."""
    return os.path.join(model_dir, CONFIG_FILE)


def history(model_dir: str) -> str:
    """One JSON line per logged step, evaluation and failure."""
    return os.path.join(model_dir, HISTORY_FILE)


def metrics(model_dir: str) -> str:
    """The run's results (``metrics/results.py`` owns its content)."""
    return os.path.join(model_dir, METRICS_FILE)


def metric_specs(model_dir: str) -> str:
    """How each logged metric is plotted and reported."""
    return os.path.join(model_dir, METRIC_SPECS_FILE)


def model_source(model_dir: str) -> str:
    """Where a user's model came from (``--model_module``), checked on resume."""
    return os.path.join(model_dir, MODEL_SOURCE_FILE)


def input_profile(model_dir: str) -> str:
    """The input pipeline's measured throughput (``--profile_input``)."""
    return os.path.join(model_dir, INPUT_PROFILE_FILE)


def report(model_dir: str) -> str:
    """The run's Markdown report."""
    return os.path.join(model_dir, REPORT_FILE)


def plots(model_dir: str) -> str:
    """The folder of the report's PNG plots."""
    return os.path.join(model_dir, PLOTS_DIR)


def plot_name(plot: str) -> str:
    """A plot's path relative to model_dir, as report.md links it."""
    return os.path.join(PLOTS_DIR, f"{plot}.png")


def plot(model_dir: str, name: str) -> str:
    """A plot's PNG file."""
    return os.path.join(model_dir, plot_name(name))


def checkpoints(model_dir: str) -> str:
    """The chief's checkpoints (a non-chief worker passes its temporary directory as ``model_dir``)."""
    return os.path.join(model_dir, CHECKPOINTS_DIR)


def checkpoint_state(model_dir: str) -> str:
    """TensorFlow's state file naming the latest checkpoint."""
    return os.path.join(checkpoints(model_dir), CHECKPOINT_STATE_FILE)


def checkpoint(model_dir: str, step: int) -> str:
    """The prefix (files without ``.index``/``.data-*``) of the checkpoint saved at ``step``."""
    return os.path.join(checkpoints(model_dir), f"{CHECKPOINT_PREFIX}{step}")


def summaries(model_dir: str, run: str = "") -> str:
    """TensorBoard's log directory, or one run in it (``train``, ``validation``, ``samples``)."""
    return os.path.join(model_dir, SUMMARIES_DIR, run) if run else os.path.join(model_dir, SUMMARIES_DIR)


def profile(model_dir: str) -> str:
    """TensorFlow profiler traces (``--profile_steps``)."""
    return os.path.join(model_dir, PROFILE_DIR)


def export(model_dir: str) -> str:
    """The folder of exported models."""
    return os.path.join(model_dir, EXPORT_DIR)


def exported_model(model_dir: str) -> str:
    """The exported Keras model (pixels in)."""
    return os.path.join(model_dir, EXPORT_DIR, EXPORTED_MODEL)


def exported_bare_model(model_dir: str) -> str:
    """The exported network alone (a classifier for FID features)."""
    return os.path.join(model_dir, EXPORT_DIR, EXPORTED_BARE_MODEL)


def exported_saved_model(model_dir: str) -> str:
    """The exported SavedModel (``tfgpu.export --format=saved_model``)."""
    return os.path.join(model_dir, EXPORT_DIR, EXPORTED_SAVED_MODEL)


def samples(model_dir: str) -> str:
    """The folder of generated sample grids."""
    return os.path.join(model_dir, SAMPLES_DIR)


def evaluation_samples(model_dir: str, step: int) -> str:
    """The grid a GAN's evaluation at ``step`` writes."""
    return os.path.join(model_dir, SAMPLES_DIR, f"step_{step}.png")


def sampled(model_dir: str, step: int) -> str:
    """The grid ``tfgpu.sample`` writes from the checkpoint of ``step`` (unless --out names another)."""
    return os.path.join(model_dir, SAMPLES_DIR, f"sample_step{step}.png")


def evaluation(model_dir: str, split: str, step: int) -> str:
    """The metrics ``tfgpu.evaluate`` writes for ``split`` at ``step`` (unless --output_json names another)."""
    return os.path.join(model_dir, f"{EVALUATION_PREFIX}{split}-step{step}.json")


def fid_features(model_dir: str) -> str:
    """Cached real-image features for FID/KID."""
    return os.path.join(model_dir, FID_FEATURES_DIR)


def write_probe(model_dir: str, pid: int) -> str:
    """A file written and removed at start-up to prove model_dir is writable before any work."""
    return os.path.join(model_dir, f"{WRITE_PROBE}{pid}")
