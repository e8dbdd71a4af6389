"""The GAN task's options section: its flags, their defaults and the checks of their values.

Users set them as flat flags (``--n_critic=5``) and config.yaml records them flat; ``config_sources`` builds
this section from those values when ``--task=gan`` and ``Config`` holds it as ``task_options``. A light module
(no TensorFlow): its checks run with ``Config.check_values``, before TensorFlow is imported.
"""
import dataclasses
import typing

from tfgpu.config import ConfigError, TaskOptions, option

GAN_LOSSES = ("non_saturating", "minimax", "wasserstein", "hinge")


@dataclasses.dataclass(frozen=True)
class GanOptions(TaskOptions):
    """What ``--task=gan`` reads beyond the shared options (the task reads them as ``self.options``)."""
    task: typing.ClassVar[str] = "gan"

    generator: str = option("", "GAN: your own generator builder, MODULE:FUNCTION or path/to/file.py:FUNCTION, "
                            "with the GAN builders' signature; empty = the --model family's.", "gan")
    discriminator: str = option("", "GAN: your own discriminator builder, MODULE:FUNCTION or "
                                "path/to/file.py:FUNCTION; empty = the --model family's.", "gan")
    latent_dim: int = option(128, "GAN: size of the generator's latent vector.", "gan")
    conditional: bool = option(False, "GAN: class-conditional generator and discriminator.", "gan")
    gan_loss: str = option("non_saturating", "GAN loss: non_saturating, minimax, wasserstein or hinge.", "gan",
                           GAN_LOSSES)
    gradient_penalty: float = option(0.0, "GAN: WGAN-GP gradient penalty weight (10 in the paper); 0 = off.", "gan")
    r1_gamma: float = option(0.0, "GAN: R1 penalty weight on real images; 0 = off.", "gan")
    n_critic: int = option(1, "GAN: discriminator steps per generator step.", "gan")
    g_learning_rate: float = option(2e-4, "GAN: generator learning rate (not scaled with batch).", "gan")
    d_learning_rate: float = option(2e-4, "GAN: discriminator learning rate; differs from the generator's for "
                                    "TTUR.", "gan")
    adam_beta1: float = option(0.5, "GAN: Adam beta_1 of both optimizers.", "gan")
    adam_beta2: float = option(0.999, "GAN: Adam beta_2 of both optimizers.", "gan")
    ema_decay: float = option(0.999, "GAN: decay of the generator weights' moving average used for evaluation "
                              "and samples; 0 = off.", "gan")
    diffaugment: str = option("", "GAN: DiffAugment policy, comma separated from color,translation,cutout; "
                              "empty = off.", "gan")
    fid_num_samples: int = option(2000, "GAN: generated and real images per FID/KID evaluation (up to the train "
                                  "split's size); FID is biased upward at small N, so compare FIDs at the same N.",
                                  "gan")
    inception_weights: str = option("", "GAN: local weights file (.h5/.weights.h5) of Keras's ImageNet "
                                    "InceptionV3 for FID/KID features (not the 2015 Inception graph behind "
                                    "published FIDs); empty = --fid_feature_model_dir, or, when both are empty, "
                                    "a small classifier trained automatically into <model_dir>/fid_features.", "gan")
    fid_feature_model_dir: str = option("", "GAN: model_dir of a tfgpu classifier whose penultimate features "
                                        "score FID/KID offline.", "gan")

    def check(self, config) -> None:
        """The values' own checks and the GAN's rule on the shared ``--input_range`` (microseconds, no imports)."""
        super().check(config)
        for name in ("n_critic", "latent_dim", "fid_num_samples"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be positive, got {getattr(self, name)}")
        for name in ("gradient_penalty", "r1_gamma", "ema_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if tuple(config.input_range) != (-1.0, 1.0):
            raise ConfigError("input_range", "GANs always use -1,1 (the generator ends in tanh); leave it unset "
                              "with --task=gan")
