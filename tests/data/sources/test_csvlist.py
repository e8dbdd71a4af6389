"""Reading CSV/TSV image lists as spreadsheets write them: headers, BOMs, integer ids, names, split names."""
import os

import pytest

from tfgpu.config import ConfigError
from tfgpu.data.sources import csvlist


def write(tmp_path, text, name="list.csv", encoding="utf-8"):
    for i in range(4):
        (tmp_path / f"{i}.png").write_bytes(b"x")
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return str(path)


def labels(result):
    _, rows, classes, notices = result
    return [r[2] for r in rows], classes, notices


@pytest.mark.parametrize("header", ["img,label", "file_name,class", "Image ID,Category", "path,label"])
def test_a_header_is_found_by_its_content_whatever_its_words(tmp_path, header):
    path = write(tmp_path, f"\ufeff{header}\n0.png,1\n1.png,0\n", encoding="utf-8")
    assert labels(csvlist.read_list(path)) == ([1, 0], ["0", "1"], [])


def test_no_header_and_a_bom_on_the_first_image_row(tmp_path):
    _, rows, classes, _ = csvlist.read_list(write(tmp_path, "\ufeff0.png,2\n1.png,0\n"))
    assert [(r[1], r[2]) for r in rows] == [("0.png", 2), ("1.png", 0)] and classes == ["0", "1", "2"]


def test_integer_labels_stay_the_ids_they_are(tmp_path):
    path = write(tmp_path, "0.png,3.0\n1.png,0\n2.png,10\n3.png,+2\n")
    ids, classes, notices = labels(csvlist.read_list(path))
    assert ids == [3, 0, 10, 2] and classes == [str(i) for i in range(11)] and notices == []


def test_a_negative_label_is_refused_naming_its_line(tmp_path):
    path = write(tmp_path, "path,label\n0.png,1\n1.png,-1\n")
    with pytest.raises(ConfigError, match=r"list.csv line 3: label -1 is negative"):
        csvlist.read_list(path)


def test_one_text_label_makes_names_and_says_so_in_one_line(tmp_path):
    path = write(tmp_path, "0.png,1\n1.png,2\n2.png,n/a\n")
    ids, classes, notices = labels(csvlist.read_list(path))
    assert classes == ["1", "2", "n/a"] and ids == [0, 1, 2]
    assert notices == ["list.csv: labels are class names (line 3: 'n/a' is not an integer), 3 classes sorted as "
                       "text: 1, 2, n/a"]


@pytest.mark.parametrize("split", ["../escaped", "/tmp/abs", "a b", "..", ""])
def test_split_names_that_are_not_plain_names_are_refused(tmp_path, split):
    path = write(tmp_path, f"0.png,cat,train\n1.png,dog,{split}\n")
    with pytest.raises(ConfigError, match=r"list.csv line 2: split name .* must be letters, digits, - or _"):
        csvlist.read_list(path)


def test_text_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    path = write(tmp_path, "0.png,caf\xe9\n", encoding="latin-1")
    with pytest.raises(ConfigError, match=r"list.csv: not UTF-8 text .*save it as UTF-8"):
        csvlist.read_list(path)


def test_semicolons_from_decimal_comma_locales(tmp_path):
    _, rows, classes, _ = csvlist.read_list(write(tmp_path, "path;label;split\n0.png;cat;train\n1.png;dog;val\n"))
    assert [(r[1], r[2], r[3]) for r in rows] == [("0.png", 0, "train"), ("1.png", 1, "val")]
    assert classes == ["cat", "dog"]


def test_paths_are_kept_relative_to_the_list(tmp_path):
    root, rows, _, _ = csvlist.read_list(write(tmp_path, "0.png,0\n1.png,1\n"))
    assert root == str(tmp_path) and all(os.path.isfile(os.path.join(root, r[1])) for r in rows)
