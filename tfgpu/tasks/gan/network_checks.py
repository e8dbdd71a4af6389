"""What the GAN task checks of its two networks once they are built (``tfgpu.models.heads``): a generator whose
last activation cannot reach the real images' [-1, 1], a discriminator that ends in a probability (every GAN loss
takes a raw score), and a discriminator that begins with ``Rescaling(1/255)`` (it expects 0..255 pixels but is fed
[-1, 1]). Each is one ``ConfigError`` naming the flag that built the network (--generator, --discriminator, or
--model for the family's). Cost: a walk of each network's last and first layers; for a subclassed network, one
trace of it (no forward pass). ``describe_generator``: what the exported generator takes and gives.
"""
from tfgpu.config import ConfigError
from tfgpu.models import heads
from tfgpu.tasks.gan.options import GanOptions

IMAGE_RANGE = (-1.0, 1.0)  # real images reach a GAN in [-1, 1], whatever --input_range says
_WHY_LOGITS = {
    "non_saturating": "applies the sigmoid itself (softplus of the score), so D would be sigmoid(sigmoid(x))",
    "minimax": "applies the sigmoid itself (softplus of the score), so D would be sigmoid(sigmoid(x))",
    "wasserstein": "needs an unbounded critic score",
    "hinge": "needs an unbounded score (its margins are at -1 and 1)",
}


def check_generator(generator, flag: str, reference: str) -> heads.Head:
    """The generator's head; ``ConfigError(flag)`` when its last activation's range does not cover [-1, 1]."""
    head = heads.output_head(generator)
    low, high = heads.RANGES.get(head.activation, IMAGE_RANGE)
    if low > IMAGE_RANGE[0] or high < IMAGE_RANGE[1]:
        raise ConfigError(flag, f"{reference}'s generator ends in {head.activation} (layer {head.layer!r}), which "
                          f"gives images in [{low:g}, {high:g}]; the GAN's real images are in [-1, 1]: end the "
                          "generator in tanh")
    return head


def check_discriminator(discriminator, flag: str, reference: str, gan_loss: str) -> None:
    """``ConfigError(flag)`` when the discriminator ends in a probability or begins with a Rescaling that expects
    0..255 pixels."""
    head = heads.output_head(discriminator)
    if head.gives_probabilities:
        raise ConfigError(flag, f"{reference}'s discriminator ends in a {head.activation} (layer {head.layer!r}), "
                          f"but --gan_loss={gan_loss} {_WHY_LOGITS.get(gan_loss, 'takes a raw score')}: remove the "
                          "activation so it gives one raw score (logit) per example")
    rescaling = heads.leading_rescaling(discriminator)
    if rescaling and heads.expects_pixels(*rescaling[1:]):
        layer, scale, offset = rescaling
        raise ConfigError(flag, f"{reference}'s discriminator begins with Rescaling(scale={scale:.6g}, "
                          f"offset={offset:g}) (layer {layer!r}), so it expects pixels in 0..255, but the GAN feeds "
                          "it images in [-1, 1] (real and generated alike): remove the Rescaling")


def describe_generator(config, info, facts: dict) -> dict:
    """The exported generator for ``<name>.input.json`` (``Task.describe_export``): it takes a latent (and a label
    when conditional) and gives images in [-1, 1], which only a final tanh bounds (``facts["generator_output"]``)."""
    options = GanOptions.of(config)
    inputs = {"latent": {"dtype": "float32", "shape": [None, options.latent_dim]}}
    if options.conditional:
        inputs["label"] = {"dtype": "int64", "shape": [None]}
    images = {"dtype": "float32", "layout": "NHWC", "shape": [None, *info.image_shape]}
    activation = facts.get("generator_output", "tanh")
    output = ({**images, "range": [-1.0, 1.0], "meaning": "generated images"} if activation == "tanh" else
              {**images, "range": None, "meaning": f"generated images, trained toward [-1, 1] but not bounded "
               f"(the generator ends in {activation}, not tanh): clip to [-1, 1] before making pixels"})
    return {"task": "gan", "model": config.model, "input": inputs, "output": output,
            "classes": list(info.classes)}
