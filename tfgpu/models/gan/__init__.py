"""GAN model families, registered with ``family="gan"``: dcgan, wgan_gp, sngan.

Each builder returns ``GanModels(generator, discriminator)``; see ``base``.
"""
from tfgpu.models.gan import dcgan, sngan  # noqa: F401  (registers)
from tfgpu.models.gan.base import GanModels, stage_sizes

__all__ = ["GanModels", "stage_sizes"]
