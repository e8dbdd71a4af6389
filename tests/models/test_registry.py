"""Every registered classifier builds, gives float32 logits under mixed precision and trains one step."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.models import create_model, get_spec, heads, list_models, register_model

# Deep or wide nets run only with -m slow (convnext_tiny's step alone takes ~30 s on 2 loaded cores). Their builders
# run by default on smaller members of the same family: resnet50 (bottleneck ImageNet ResNet) for resnet101/152,
# resnet20..56 for resnet110, efficientnet_b0 and mobilenet_v2 for the keras.applications wrapper convnext_tiny
# uses (whose own input scaling is checked in test_applications.py).
_BIG = {"resnet101", "resnet110", "resnet152", "convnext_tiny"}
# Deeper members of a family whose smallest member trains by default, from the same builder: resnet20 for the
# CIFAR ResNets, resnet18 for the basic-block ImageNet ResNets. Their depth is checked by default by their parameter
# counts (test_cifar_resnet.py, test_resnet.py); their steps (6-12 s each on 2 cores) run with -m slow.
_DEEPER = {"resnet32", "resnet44", "resnet56", "resnet34"}
# Both policies run by default on these; the other nets run under float16 (loss scaling) by default, bfloat16 with
# -m slow (the float32 logits come from the same builder code either way).
_BOTH_POLICIES = {"resnet20", "small_cnn"}


def _cases():
    for name in list_models(family="classifier"):
        if not get_spec(name).builder.__module__.startswith("tfgpu."):
            continue  # a model another test module registered (collected earlier in this process) is its own test's
        marks = [pytest.mark.slow] if name in _BIG | _DEEPER else []
        bf16_marks = marks if name in _BOTH_POLICIES else [pytest.mark.slow]
        yield pytest.param(name, "mixed_bfloat16", id=f"{name}-bf16", marks=bf16_marks)
        yield pytest.param(name, "mixed_float16", id=f"{name}-fp16", marks=marks)


def _batch(size=32, channels=3, n=4, classes=10):
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (n, size, size, channels)).astype("float32")
    return images, rng.integers(0, classes, n)


@pytest.mark.parametrize("name,policy", list(_cases()))
def test_classifier_gives_float32_logits_and_trains_one_step(name, policy):
    keras.mixed_precision.set_global_policy(policy)
    model = create_model(name, (32, 32, 3), num_classes=10)
    images, labels = _batch()
    assert model(images, training=False).dtype == "float32"
    assert heads.output_head(model).activation is None  # logits: no softmax the classification loss would undo

    # The head is the last matrix whatever its layer is called (no naming rule for a model's head).
    first, head = model.trainable_variables[0], [v for v in model.trainable_variables if len(v.shape) == 2][-1]
    before = [first.numpy(), head.numpy()]
    optimizer = keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    assert logits.shape == (4, 10) and logits.dtype == "float32"
    assert np.isfinite(loss.numpy())
    # The first trainable weight changes only if the gradient made it back through the whole net.
    assert not np.allclose(first.numpy(), before[0]), f"{first.path} did not change"
    assert not np.allclose(head.numpy(), before[1])


def test_registering_a_taken_name_raises_and_keeps_the_original():
    original = get_spec("resnet50").builder
    with pytest.raises(ValueError, match="resnet50.*registered twice"):
        register_model("resnet50")(lambda input_shape, num_classes: None)
    assert get_spec("resnet50").builder is original


def test_unknown_model_lists_the_known_names_and_the_own_builder_form():
    with pytest.raises(ValueError, match="unknown model 'resnet5'.*efficientnet_b0.*resnet50.*; or your own builder "
                                         "as MODULE:FUNCTION or path/to/file.py:FUNCTION"):
        create_model("resnet5", (32, 32, 3), 10)


def test_a_registered_builder_with_the_wrong_logits_is_refused_naming_the_model():
    register_model("test_wrong_logits")(lambda input_shape, num_classes: keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes + 1)]))
    try:
        with pytest.raises(ValueError, match="--model: test_wrong_logits gives outputs of shape \\(None, 8\\); a "
                                             "classifier of 7 classes must give logits of shape \\(batch, 7\\)"):
            create_model("test_wrong_logits", (4, 4, 1), 7)
    finally:
        from tfgpu.models import registration

        del registration._MODELS["test_wrong_logits"]


def test_classifiers_accept_any_channel_count():
    images, _ = _batch(channels=1, n=2)
    for name in ("resnet18", "efficientnet_b0", "mobilenet_v2"):
        assert create_model(name, (32, 32, 1), 7)(images).shape == (2, 7)
