"""CIFAR ResNets (He et al. 2016, section 4.2): 6n+2 layers; the depth shows in the parameter count."""
import pytest

from tfgpu.models import create_model
from tfgpu.models.summary import count_params

# The paper's Table 6, in millions of parameters (two significant figures), at 10 classes. Its counts are for
# option A shortcuts (parameter-free); tfgpu's two shape-changing shortcuts are 1x1 projections with BatchNorm
# (option B): 16*32 + 2*32 and 32*64 + 2*64 more weights.
_PAPER = [("resnet20", 0.27), ("resnet32", 0.46), ("resnet44", 0.66), ("resnet56", 0.85), ("resnet110", 1.7)]
_PROJECTIONS = 16 * 32 + 2 * 32 + 32 * 64 + 2 * 64


@pytest.mark.parametrize("name,millions", _PAPER)
def test_param_counts_match_the_paper(name, millions):
    count = count_params(create_model(name, (32, 32, 3), 10))
    assert float(f"{(count - _PROJECTIONS) / 1e6:.2g}") == millions
