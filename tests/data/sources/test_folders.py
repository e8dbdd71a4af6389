"""Finding a folder's labelled images: layouts, OS debris, unlabelled and empty split folders, symlinks."""
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfgpu.config import ConfigError
from tfgpu.data.sources import folders


def touch(root, *rels):
    for rel in rels:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"x")


def images(scan):
    return {split: {c: sorted(files) for c, files in by_class.items()} for split, by_class in scan.splits.items()}


def reasons(scan):
    return {reason: sorted(os.path.relpath(p, scan.root) for p in paths)
            for reason, paths in scan.not_converted.items()}


def test_mac_zip_debris_is_ignored_everywhere_and_counted(tmp_path):
    touch(tmp_path, "train/cat/0.jpg", "train/dog/0.jpg", "val/cat/0.jpg", "val/dog/0.jpg",
          "__MACOSX/train/cat/._0.jpg", ".DS_Store", "train/.DS_Store", "train/cat/._0.jpg", "val/dog/Thumbs.db",
          "train/dog/desktop.ini", "train/cat/.hidden/1.jpg")
    scan = folders.scan_folder(str(tmp_path))
    assert scan.presplit
    assert images(scan) == {"train": {"cat": ["train/cat/0.jpg"], "dog": ["train/dog/0.jpg"]},
                            "val": {"cat": ["val/cat/0.jpg"], "dog": ["val/dog/0.jpg"]}}
    assert reasons(scan) == {"os_or_hidden": [".DS_Store", "__MACOSX", "train/.DS_Store", "train/cat/._0.jpg",
                                              "train/cat/.hidden", "train/dog/desktop.ini", "val/dog/Thumbs.db"]}


def test_unlabelled_and_empty_split_folders_are_skipped_with_a_notice(tmp_path):
    touch(tmp_path, "train/cat/0.png", "train/dog/0.png", "test/1.jpg", "test/2.jpg", "test/readme.txt")
    os.makedirs(tmp_path / "val")
    scan = folders.scan_folder(str(tmp_path))
    assert images(scan) == {"train": {"cat": ["train/cat/0.png"], "dog": ["train/dog/0.png"]}}
    assert reasons(scan) == {"unlabelled_split": ["test/1.jpg", "test/2.jpg"], "not_an_image": ["test/readme.txt"]}
    assert scan.notices == ["skipping test/: its 2 image(s) are not in class folders, so they have no labels",
                            "skipping val/: no class folders"]


def test_split_folders_beside_other_folders_are_ambiguous(tmp_path):
    touch(tmp_path, "train/cat/0.png", "extra/0.png")
    with pytest.raises(ConfigError, match=r"ambiguous: it has split folders \(train\) and other folders \(extra\)"):
        folders.scan_folder(str(tmp_path))


def test_symlink_loops_and_links_into_other_classes_are_not_followed(tmp_path):
    touch(tmp_path, "cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png")
    os.symlink("..", tmp_path / "cat" / "up")  # a loop through the root: dog images would become cats
    os.symlink(os.path.join("..", "dog"), tmp_path / "cat" / "dogs")
    os.symlink(os.path.join("..", "dog", "0.png"), tmp_path / "cat" / "2.png")
    os.symlink(".", tmp_path / "dog" / "self")
    scan = folders.scan_folder(str(tmp_path))
    assert images(scan) == {"train": {"cat": ["cat/0.png", "cat/1.png"], "dog": ["dog/0.png", "dog/1.png"]}}
    assert reasons(scan) == {"symlink_loop": ["cat/up", "dog/self"],
                             "symlink_to_other_class": ["cat/2.png", "cat/dogs"]}
    assert scan.followed_outside == []


def test_a_link_leading_outside_its_class_folder_is_followed_and_said(tmp_path):
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    touch(root, "cat/0.png", "dog/0.png")
    touch(elsewhere, "more/1.png", "more/2.png")
    os.symlink(elsewhere / "more", root / "cat" / "more")
    scan = folders.scan_folder(str(root))
    assert images(scan)["train"]["cat"] == ["cat/0.png", "cat/more/1.png", "cat/more/2.png"]
    assert scan.followed_outside == ["cat/more/1.png", "cat/more/2.png"]


def test_an_outside_image_reached_from_two_classes_is_taken_once_in_the_first(tmp_path):
    """One folder outside the dataset linked from two classes (and twice from one, once through a subfolder link):
    each image is converted once, under the first class in sorted order, and every other way to it is said
    (found by the property test below: the same image was taken as a cat and as a dog)."""
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    touch(root, "cat/0.png", "dog/0.png")
    touch(elsewhere, "more/1.png", "more/sub/2.png")
    os.symlink(elsewhere / "more", root / "cat" / "more")
    os.symlink(elsewhere / "more" / "sub", root / "cat" / "sub")
    os.symlink(elsewhere / "more", root / "dog" / "more")
    scan = folders.scan_folder(str(root))
    assert images(scan)["train"] == {"cat": ["cat/0.png", "cat/more/1.png", "cat/more/sub/2.png"],
                                     "dog": ["dog/0.png"]}
    assert reasons(scan) == {"symlink_loop": ["cat/sub"],  # a folder already visited through cat/more
                             "symlink_to_taken_image": ["dog/more/1.png", "dog/more/sub/2.png"]}


def test_other_extensions_loose_images_and_unreadable_folders_are_counted(tmp_path, monkeypatch):
    touch(tmp_path, "cat/0.webp", "cat/1.TIF", "cat/2.heic", "cat/sub/3.JPEG", "dog/0.gif", "dog/locked/1.png",
          "loose.png")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    scan = folders.scan_folder(str(tmp_path))
    assert images(scan) == {"train": {"cat": ["cat/0.webp", "cat/1.TIF", "cat/sub/3.JPEG"], "dog": ["dog/0.gif"]}}
    assert reasons(scan) == {"not_an_image": ["cat/2.heic"], "outside_class_folder": ["loose.png"],
                             "unreadable_folder": ["dog/locked"]}


def test_a_class_folder_name_that_is_not_utf8_is_refused_naming_it(tmp_path):
    touch(tmp_path, "dog/0.png")
    bad = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9")
    os.makedirs(bad)
    with open(os.path.join(bad, b"0.png"), "wb") as f:
        f.write(b"x")
    with pytest.raises(ConfigError, match=r"caf\\xe9: a class folder name must be UTF-8"):
        folders.scan_folder(str(tmp_path))


_NAMES = st.sampled_from(["a.png", "b.jpg", ".DS_Store", "._a.png", "notes.txt", "__MACOSX"])
_LINKS = st.sampled_from(["..", "../..", ".", "../{other}", "../{other}/a.png", "{outside}", "sub"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.tuples(st.sampled_from(["cat", "dog", "cat/sub", "dog/sub"]), _NAMES), max_size=10),
       links=st.lists(st.tuples(st.sampled_from(["cat", "dog", "cat/sub"]), _LINKS), max_size=4))
def test_every_image_is_taken_once_from_its_own_class_or_said(tmp_path_factory, files, links):
    """Whatever the debris and links: the scan ends; each real image is taken at most once, in its own class, unless
    it came through a link leading outside (which is said); nothing of another class is taken."""
    base = tmp_path_factory.mktemp("tree")
    root, outside = base / "root", base / "outside"
    touch(outside, "x.png")
    for folder, name in files:
        touch(root, f"{folder}/{name}")
    os.makedirs(root / "cat", exist_ok=True)
    os.makedirs(root / "dog", exist_ok=True)
    for i, (folder, target) in enumerate(links):
        other = "dog" if folder.startswith("cat") else "cat"
        os.makedirs(root / folder, exist_ok=True)
        os.symlink(target.format(other=other, outside=outside), root / folder / f"link{i}")
    scan = folders.scan_folder(str(root))
    taken = [(c, os.path.realpath(os.path.join(str(root), rel)), rel)
             for by_class in scan.splits.values() for c, rels in by_class.items() for rel in rels]
    assert len({real for _, real, _ in taken}) == len(taken)
    for c, real, rel in taken:
        assert real.startswith(str(root / c) + os.sep) or rel in scan.followed_outside
        assert not real.startswith(str(root / ("dog" if c == "cat" else "cat")) + os.sep)
