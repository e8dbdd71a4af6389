"""tfgpu.training.exporting: what an exported model says about its input and output."""
import dataclasses
import json

from tfgpu.config import Config
from tfgpu.training import exporting


@dataclasses.dataclass
class _Info:
    image_shape: tuple = (8, 8, 1)
    classes: tuple = tuple(str(i) for i in range(10))

    @property
    def num_classes(self):
        return len(self.classes)


def test_a_classifier_states_its_input_range_and_how_to_scale_pixels(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits", input_range=(0.0, 255.0))
    path = exporting.write_description(config, _Info(), str(tmp_path / "export" / "model.keras"))
    assert path == str(tmp_path / "export" / "model.input.json")
    with open(path) as f:
        described = json.load(f)
    assert described["input"]["range"] == [0.0, 255.0] and described["input"]["shape"] == [None, 8, 8, 1]
    assert described["output"]["shape"] == [None, 10]
    assert exporting.summary(described) == "input: float32 NHWC images in [0, 255] (--input_range)"


def test_a_gan_describes_its_latent_input_and_its_images_in_minus_one_to_one(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits", task="gan", model="dcgan", latent_dim=16,
                    conditional=True)
    described = exporting.describe(config, _Info())
    assert described["input"] == {"latent": {"dtype": "float32", "shape": [None, 16]},
                                  "label": {"dtype": "int64", "shape": [None]}}
    assert described["output"]["range"] == [-1.0, 1.0]
    assert exporting.description_path("out/saved_model/") == "out/saved_model.input.json"


def test_a_softmax_headed_classifier_is_described_as_giving_probabilities(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits")
    logits = exporting.describe(config, _Info(), {"model_output": "logits", "loss_from": "logits"})
    assert logits["output"]["kind"] == "logits" and logits == exporting.describe(config, _Info())
    described = exporting.describe(config, _Info(), {"model_output": "probabilities", "loss_from": "probabilities"})
    assert described["output"]["kind"] == "probabilities"
    assert described["output"]["meaning"].startswith("probabilities, one per class, summing to 1")
    assert exporting.summary(described) == ("input: float32 NHWC images in [-1, 1] (--input_range); "
                                            "output: probabilities")


def test_a_generator_without_a_final_tanh_is_described_as_unbounded(tmp_path):
    config = Config(model_dir=str(tmp_path), dataset="digits", task="gan", model="dcgan")
    described = exporting.describe(config, _Info(), {"generator_output": "linear"})
    assert described["output"]["range"] is None and "clip to [-1, 1]" in described["output"]["meaning"]
    assert exporting.summary(described) == "outputs float32 images, not bounded to [-1, 1] (no final tanh)"
    assert exporting.describe(config, _Info(), {"generator_output": "tanh"})["output"]["range"] == [-1.0, 1.0]
