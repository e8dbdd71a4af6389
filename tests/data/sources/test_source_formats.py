"""The --source table: every registered format opens a source of its kind (no format without a case here), the
flag's help and errors are written from the table, and a value no format takes is one line naming --source."""
import re

import numpy as np
import pytest

from tests.data.conftest import CLASSES
from tests.data.sources.test_foreign import write_model_garden
from tfgpu.config import ConfigError
from tfgpu.data.conversion import convert
from tfgpu.data.sources import source_formats


def _folder(png_folder, tmp_path):
    return png_folder[0]


def _csv(png_folder, tmp_path):
    root, images = png_folder
    path = tmp_path / "list.csv"
    path.write_text("".join(f"{root}/{rel},{cls}\n" for rel, (_, cls) in images.items()))
    return str(path)


def _npz(png_folder, tmp_path):
    path = tmp_path / "arrays.npz"
    np.savez(path, x=np.zeros((6, 4, 4), np.uint8), y=np.arange(6) % 3)
    return str(path)


def _tfrecord(png_folder, tmp_path):
    write_model_garden(tmp_path / "garden", n_train=6, n_val=3, shards=1, offset=0)
    return f"tfrecord:{tmp_path / 'garden'}/*"


def _tfds(png_folder, tmp_path):
    return "tfds:tfgpu_tiny_shapes"


# One value of each registered kind, by its form, and how many classes it holds.
EXAMPLES = {
    "tfrecord:GLOB": (_tfrecord, None),
    "tfds:NAME": (_tfds, len(CLASSES)),
    "an image folder": (_folder, len(CLASSES)),
    "a .csv/.tsv": (_csv, len(CLASSES)),
    "a .npz": (_npz, 3),
    "a built-in dataset (digits, mnist5k)": (lambda *_: "digits", 10),
}


def test_every_registered_format_has_a_case_here():
    assert set(EXAMPLES) == {kind.form for kind in source_formats.SOURCE_FORMATS}


@pytest.mark.parametrize("kind", source_formats.SOURCE_FORMATS, ids=lambda kind: kind.form)
def test_every_registered_format_claims_and_opens_a_source_of_its_kind(kind, png_folder, tmp_path, tfds_dir):
    make, num_classes = EXAMPLES[kind.form]
    value = make(png_folder, tmp_path)
    assert [k for k in source_formats.SOURCE_FORMATS if k.claims(value)][0] is kind
    source = source_formats.open_source(value, convert.Options(value, str(tmp_path / "out"), tfds_data_dir=tfds_dir))
    assert source.splits and all(len(split) for split in source.splits.values())
    if num_classes:
        assert len(source.classes) == num_classes


def test_the_help_and_the_errors_are_written_from_the_table(tmp_path):
    help_text = source_formats.help_text()
    assert all(kind.help in help_text for kind in source_formats.SOURCE_FORMATS)
    forms = [kind.form for kind in source_formats.SOURCE_FORMATS]
    assert source_formats.forms() == ", ".join(forms[:-1]) + " or " + forms[-1]
    with pytest.raises(ConfigError, match=f"^--source: is required: {re.escape(source_formats.forms())}$"):
        source_formats.open_source("", None)
    with pytest.raises(ConfigError, match=f"^--source: .*nowhere does not exist \\(expected "
                                          f"{re.escape(source_formats.forms())}\\)$"):
        source_formats.open_source(str(tmp_path / "nowhere"), None)
    (tmp_path / "notes.txt").write_text("x")
    files = " or ".join(kind.form for kind in source_formats.SOURCE_FORMATS if kind.is_file)
    with pytest.raises(ConfigError, match=f"^--source: .*notes\\.txt: a file, but not {re.escape(files)}$"):
        source_formats.open_source(str(tmp_path / "notes.txt"), None)


def test_the_convert_command_help_is_the_tables():
    from tfgpu import convert as command

    (action,) = [a for a in command.build_parser()._actions if "--source" in a.option_strings]
    assert action.help == source_formats.help_text()
