"""tfgpu.data.schema.tfrecord: the manifest's version, and records parsed by another writer's keys with a label
offset."""
import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfgpu.data.schema import tfrecord


def _record(features):
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


@settings(max_examples=25, deadline=None)
@given(label=st.integers(-(1 << 40), 1 << 40), offset=st.integers(-1000, 1000), labelled=st.booleans(),
       has_label=st.booleans())
def test_a_label_is_read_with_its_offset_and_a_missing_one_stays_missing(label, offset, labelled, has_label):
    """Under ``record_keys``, the parsed label is the stored one plus the offset; a record without one parses as
    the value the label check reports as missing (labelled) or -1, never shifted into a class index."""
    keys = tfrecord.RecordKeys("jpg", "cls", offset)
    features = {"jpg": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\x89PNG"]))}
    if has_label:
        features["cls"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    parsed = tfrecord.parse_example(_record(features), labelled=labelled, keys=keys)
    missing = tfrecord.MISSING_LABEL if labelled else -1
    assert int(parsed[tfrecord.LABEL]) == (label + offset if has_label else missing)
    assert parsed[tfrecord.ENCODED].numpy() == b"\x89PNG" and parsed[tfrecord.FORMAT].numpy() != b"raw"


def test_the_manifest_version(tmp_path):
    """A manifest without format_version is version 1 and loads; a version this tfgpu does not know stops in one
    line naming it."""
    entry = tfrecord.write_arrays(str(tmp_path), "train", np.zeros((4, 2, 2, 1), np.uint8), np.arange(4) % 2, 1)
    body = {"name": "v1", "classes": ["a", "b"], "compression": "none", "splits": {"train": entry},
            "image_shape": {"height": 2, "width": 2, "channels": 1}}
    (tmp_path / tfrecord.MANIFEST).write_text(json.dumps(body))
    assert tfrecord.read_manifest(str(tmp_path))["name"] == "v1"
    (tmp_path / tfrecord.MANIFEST).write_text(json.dumps({**body, "format_version": 3}))
    with pytest.raises(ValueError) as error:
        tfrecord.read_manifest(str(tmp_path))
    assert str(error.value) == (f"{tmp_path}/dataset.json: format_version 3 is not one this tfgpu reads (1, 2): "
                                "upgrade tfgpu, or convert the dataset with this one")
