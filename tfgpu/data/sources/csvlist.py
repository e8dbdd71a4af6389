"""Reading a CSV/TSV list of images: ``path,label[,split]`` rows, as spreadsheets export them.

- A UTF-8 byte-order mark (Excel's "CSV UTF-8") is stripped; text that is not UTF-8
  is refused naming the file. A ``.csv`` whose first row has ``;`` and no ``,`` is
  read with ``;`` (spreadsheets in locales with a decimal comma write those).
- The first row is a header when its path cell names no existing file and has no
  image extension (``img,label``, ``path,label,split``, ...), whatever its words.
- Labels that are all integers (``3``, ``-0``, or ``3.0`` as Excel writes them) are
  class ids as they are; a negative one is refused naming its line. Otherwise every
  label is a class name, classes sorted as text, and one notice says so, naming the
  first label that is not an integer.
- Split names must be letters, digits, ``-`` or ``_`` (they become file names).
"""
import csv
import os
import re

from tfgpu.config import ConfigError
from tfgpu.data.sources import folders

_INTEGER = re.compile(r"^[+-]?\d+(\.0*)?$")
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def check_split_name(name: str, where: str, flag: str = "source") -> str:
    """``name`` if it is a safe split name (it becomes a shard file name), else ConfigError naming ``where``."""
    if not _SPLIT_NAME.match(name or ""):
        raise ConfigError(flag, f"{where}: split name {name!r} must be letters, digits, - or _ (it names the "
                          "shard files)")
    return name


def _read_rows(path):
    """[(line number, [cells])] of the non-empty, non-comment rows."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ConfigError("source", f"{path}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                          "save it as UTF-8 (in Excel: CSV UTF-8)") from None
    except OSError as e:
        raise ConfigError("source", f"{path}: cannot read ({e.strerror or e})") from None
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
    first = next((line for line in text.splitlines() if line.strip()), "")
    if delimiter == "," and ";" in first and "," not in first:
        delimiter = ";"
    rows = []
    for lineno, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        rows.append((lineno, [c.strip() for c in row]))
    return rows, delimiter


def _is_header(cells, root):
    path = cells[0]
    return not folders.is_image_name(path) and not os.path.isfile(os.path.join(root, path))


def read_list(path: str):
    """Parses a CSV/TSV list; returns (root, rows [(lineno, relpath, label, split or None)], classes, notices)."""
    root = os.path.dirname(path)
    rows, delimiter = _read_rows(path)
    if rows and _is_header(rows[0][1], root):
        rows = rows[1:]
    parsed = []
    for lineno, cells in rows:
        if len(cells) not in (2, 3) or not cells[0] or not cells[1]:
            raise ConfigError("source", f"{path} line {lineno}: expected path{delimiter}label[{delimiter}split], "
                              f"got {delimiter.join(cells)!r}")
        split = check_split_name(cells[2], f"{path} line {lineno}") if len(cells) == 3 else None
        parsed.append((lineno, cells[0], cells[1], split))
    if not parsed:
        raise ConfigError("source", f"{path} lists no images")
    if len({r[3] is None for r in parsed}) > 1:
        raise ConfigError("source", f"{path}: either every row names a split (path,label,split) or none does")
    labels, classes, notices = _labels([(r[0], r[2]) for r in parsed], path)
    return root, [(r[0], r[1], label, r[3]) for r, label in zip(parsed, labels)], classes, notices


def _labels(raw, path):
    """[(lineno, label text)] -> (label ids, class names in id order, notices)."""
    text = next(((n, t) for n, t in raw if not _INTEGER.match(t)), None)
    if text is None:
        ids = [int(float(t)) for _, t in raw]
        negative = next(((n, t) for (n, t), i in zip(raw, ids) if i < 0), None)
        if negative:
            raise ConfigError("source", f"{path} line {negative[0]}: label {negative[1]} is negative; integer labels "
                              "are class ids 0, 1, ... (drop unlabelled rows, or use class names)")
        return ids, [str(i) for i in range(max(ids) + 1)], []
    classes = sorted({t for _, t in raw})
    index = {c: i for i, c in enumerate(classes)}
    shown = ", ".join(classes[:8]) + (" ..." if len(classes) > 8 else "")
    notice = (f"{os.path.basename(path)}: labels are class names (line {text[0]}: {text[1]!r} is not an integer), "
              f"{len(classes)} classes sorted as text: {shown}")
    return [index[t] for _, t in raw], classes, [notice]
