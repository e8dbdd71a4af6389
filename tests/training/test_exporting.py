"""tfgpu.training.exporting: what an exported model says about its input and output."""
import dataclasses
import json
import os

from tfgpu import config_sources
from tfgpu.config import Config
from tfgpu.training import exporting


@dataclasses.dataclass
class _Info:
    image_shape: tuple = (8, 8, 1)
    classes: tuple = tuple(str(i) for i in range(10))

    @property
    def num_classes(self):
        return len(self.classes)


def test_a_classifier_takes_pixels_and_its_bare_export_states_the_input_range(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits", input_range=(0.0, 1.0))
    path = exporting.write_description(config, _Info(), str(tmp_path / "export" / "model.keras"))
    assert path == str(tmp_path / "export" / "model.input.json")
    with open(path) as f:
        described = json.load(f)
    assert described["input"]["range"] == [0.0, 255.0] and described["input"]["shape"] == [None, 8, 8, 1]
    assert described["bare"]["file"] == "model.bare.keras" and described["bare"]["input"]["range"] == [0.0, 1.0]
    assert described["output"]["shape"] == [None, 10]
    assert exporting.summary(described) == "input: NHWC pixels 0..255 (uint8 or float32); model.bare.keras: " \
                                           "float32 in [0, 1]"
    assert exporting.variant_path("out/model.keras", "bare") == "out/model.bare.keras"
    assert exporting.variant_path("out/saved_model/", "bare") == "out/saved_model.bare"


def test_a_gan_describes_its_latent_input_and_its_images_in_minus_one_to_one(tmp_path):
    config = config_sources.build(model_dir=str(tmp_path), dataset="digits", task="gan", model="dcgan",
                                  latent_dim=16, conditional=True)
    described = exporting.describe(config, _Info())
    assert described["input"] == {"latent": {"dtype": "float32", "shape": [None, 16]},
                                  "label": {"dtype": "int64", "shape": [None]}}
    assert described["output"]["range"] == [-1.0, 1.0]
    assert exporting.summary(described) == "outputs float32 generated images in [-1, 1]"
    assert exporting.description_path("out/saved_model/") == "out/saved_model.input.json"


def test_a_softmax_headed_classifier_is_described_as_giving_probabilities(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits")
    logits = exporting.describe(config, _Info(), {"model_output": "logits", "loss_from": "logits"})
    assert logits["output"]["kind"] == "logits" and logits == exporting.describe(config, _Info())
    described = exporting.describe(config, _Info(), {"model_output": "probabilities", "loss_from": "probabilities"})
    assert described["output"]["kind"] == "probabilities"
    assert described["output"]["meaning"].startswith("probabilities, one per class, summing to 1")
    assert exporting.summary(described) == "input: NHWC pixels 0..255 (uint8 or float32); output: probabilities"


def test_a_generator_without_a_final_tanh_is_described_as_unbounded(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits", task="gan", model="dcgan")
    described = exporting.describe(config, _Info(), {"generator_output": "linear"})
    assert described["output"]["range"] is None and "clip to [-1, 1]" in described["output"]["meaning"]
    assert exporting.summary(described).startswith("outputs float32 generated images, trained toward [-1, 1] but not "
                                                   "bounded (the generator ends in linear, not tanh)")
    assert exporting.describe(config, _Info(), {"generator_output": "tanh"})["output"]["range"] == [-1.0, 1.0]


def test_the_export_on_raw_validation_pixels_scores_the_run_s_val_accuracy(train_here, tmp_path, data_cache):
    """model.keras takes the digits as stored (uint8 pixels): its accuracy on the raw validation images is the
    run's val_accuracy."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tests.conftest import read_metrics
    from tfgpu.config import DatasetConfig
    from tfgpu.data import catalog
    from tfgpu.data.schema import tfrecord

    train_here("--dataset=digits", "--model=small_cnn", "--global_batch_size=64", "--train_steps=300",
               "--steps_per_loop=100", "--verbose=0", f"--model_dir={tmp_path}")
    info = catalog.prepare(DatasetConfig.of(Config(model_dir=str(tmp_path), dataset="digits",
                                                   data_cache_dir=data_cache)))
    images, labels = [], []
    for serialized in tf.data.TFRecordDataset([f for f, _ in info.split_files[info.eval_split]]):
        features = tfrecord.parse_example(serialized)
        images.append(tfrecord.decode_image(features, 1).numpy())
        labels.append(int(features[tfrecord.LABEL]))
    images = np.stack(images)
    assert images.dtype == np.uint8 and len(images) == 359
    model = keras.saving.load_model(tmp_path / "export" / "model.keras")
    accuracy = float(np.mean(np.argmax(model.predict(images, verbose=0), -1) == np.array(labels)))
    val_accuracy = read_metrics(tmp_path)["val_accuracy"]
    assert val_accuracy > 0.5 and abs(accuracy - val_accuracy) <= 0.01, (accuracy, val_accuracy)


def test_a_saved_model_is_written_under_a_tempfile_name_and_gets_the_umasks_mode(tmp_path):
    """The SavedModel goes to an unpredictable directory beside the target (not ``<output>.tmp-<pid>``, a name
    another user could create first), then is renamed into place with the mode os.mkdir would give."""
    import stat

    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    output = tmp_path / "out" / "sm"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / f"sm.tmp-{os.getpid()}").symlink_to(tmp_path / "elsewhere")  # the old name, taken
    umask = os.umask(0o022)
    try:
        exporting._save_model(model, str(output))
    finally:
        os.umask(umask)
    assert (output / "saved_model.pb").exists() and not (tmp_path / "elsewhere").exists()
    assert stat.S_IMODE(output.stat().st_mode) == 0o755
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sm", f"sm.tmp-{os.getpid()}"]
