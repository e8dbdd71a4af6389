"""tfgpu.models.fingerprint: what a built model is, as a resume compares it; each difference named in words, and
nothing that an option compares already or a restore replaces counted as one (issue 37)."""
import keras
import pytest
from keras import layers

from tfgpu.models import fingerprint


def _net(activation="relu", pooling=layers.GlobalAveragePooling2D, units=10, policy=None, trainable=True,
         gamma="ones", extra=False):
    keras.backend.clear_session()  # the same layer names each build, as experiment.setup builds
    inputs = keras.Input((8, 8, 1))
    x = layers.Conv2D(4, 3, activation=activation, name="conv", dtype=policy, trainable=trainable)(inputs)
    x = layers.BatchNormalization(name="bn", gamma_initializer=gamma)(x)
    x = pooling(name="pool")(x)
    if extra:
        x = layers.Dropout(0.5, name="drop")(x)
    return keras.Model(inputs, layers.Dense(units, name="logits")(x))


def _of(model, sources=None):
    return fingerprint.of({"model": model}, sources or {})


def test_the_issue_s_edit_is_named_layer_by_layer():
    """Another activation and another pooling layer: the same variables, so the checkpoint's own check let it
    resume silently."""
    found = fingerprint.differences(_of(_net()), _of(_net(activation="gelu",
                                                          pooling=layers.GlobalMaxPooling2D)))
    assert [d.describe() for d in found] == ["layer 'conv' activation changed: 'relu' -> 'gelu'",
                                             "layer 'pool' changed: GlobalAveragePooling2D -> GlobalMaxPooling2D"]


def test_the_same_model_built_again_has_no_difference():
    assert fingerprint.differences(_of(_net()), _of(_net())) == []


@pytest.mark.parametrize("edit", [dict(policy="mixed_float16"), dict(trainable=False), dict(gamma="zeros")])
def test_what_an_option_compares_or_a_restore_replaces_is_no_difference(edit):
    """--precision (the dtype policy), --freeze (trainable), --zero_init_residual (an initializer)."""
    assert fingerprint.differences(_of(_net()), _of(_net(**edit))) == []


def test_a_layer_added_a_variable_reshaped_and_a_graph_op_changed_are_named():
    added = [d.describe() for d in fingerprint.differences(_of(_net()), _of(_net(extra=True)))]
    assert added[:2] == ["layer 'drop' changed: absent -> Dropout", "layer 'logits' inputs changed: pool -> drop"]
    found = [d.describe() for d in fingerprint.differences(_of(_net()), _of(_net(units=12)))]
    assert "layer 'logits' units changed: 10 -> 12" in found
    assert "variable 'logits/kernel' changed: [4, 10] -> [4, 12]" in found

    def head(function):
        keras.backend.clear_session()
        inputs = keras.Input((4,))
        return keras.Model(inputs, function(layers.Dense(3, name="d")(inputs)))

    assert [d.describe() for d in fingerprint.differences(_of(head(keras.ops.softmax)), _of(head(keras.ops.sigmoid)))
            ] == ["layer 'softmax' (now 'sigmoid') changed: Softmax -> Sigmoid"]  # Keras names an op by its class


def test_a_config_key_only_one_side_has_is_no_difference():
    """A newer Keras that adds an argument to a layer's config must not refuse every resume."""
    old, new = _of(_net()), _of(_net())
    del old["models"]["model"]["layers"]["conv"]["config"]["activation"]
    assert fingerprint.differences(old, new) == []


def test_a_changed_source_is_named_by_its_file_and_hashes_and_the_line_counts_the_rest():
    before = _of(_net(), {"model": {"what": "--model file /x/net.py", "sha256": "a" * 64}})
    after = _of(_net(activation="gelu", pooling=layers.GlobalMaxPooling2D, units=12),
                {"model": {"what": "--model file /x/net.py", "sha256": "b" * 64}})
    found = fingerprint.differences(before, after)
    assert found[-1].describe() == f"--model file /x/net.py changed: sha256 {'a' * 12} -> sha256 {'b' * 12}"
    assert fingerprint.summary(found).endswith(f"(and {len(found) - 3} more)")
    assert fingerprint.summary(found).count(" changed: ") == 3


def test_a_record_of_sources_alone_compares_the_sources_alone():
    """What model_source.json gives for a checkpoint written before fingerprints were recorded."""
    sources = {"model": {"what": "--model file /x/net.py", "sha256": "a" * 64}}
    assert fingerprint.differences({"sources": sources}, _of(_net(units=12), sources)) == []
    edited = {"model": {"what": "--model file /x/net.py", "sha256": "b" * 64}}
    assert [d.what for d in fingerprint.differences({"sources": sources}, _of(_net(), edited))] == [
        "--model file /x/net.py"]
