"""Finding the labelled images of an image folder, as a careful person would, and saying what was left out.

Layouts: ``root/<class>/...`` (one split, ``train``), or ``root/<split>/<class>/...`` when
every top-level folder is a split name (train, val, validation, test). Rules:

- OS debris is ignored everywhere and counted: hidden names (``.DS_Store``, ``._x``
  AppleDouble files, ``.git``), ``__MACOSX``, ``Thumbs.db``, ``desktop.ini``, ``@eaDir``,
  ``$RECYCLE.BIN``, ``System Volume Information``.
- A split folder without class folders (Kaggle's unlabelled ``test/*.jpg``) or without
  images is skipped with a notice; split folders beside other folders are ambiguous
  and refused.
- Symlinks are followed, but a folder already visited, one that contains the class
  folder (a loop such as ``cat/up -> ..``) and any link into (or around) another
  class or split folder are not; a link leading outside its class folder is followed
  and counted, so it is said.
- A folder that cannot be listed is reported (``convert`` stops on it unless
  ``--skip_bad``); files with other extensions and images outside class folders are
  counted by reason.

Nothing here reads image bytes.
"""
import dataclasses
import os

from tfgpu.config import ConfigError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLIT_FOLDERS = ("train", "val", "validation", "test")
DEBRIS = {"__macosx", "thumbs.db", "desktop.ini", "@eadir", "$recycle.bin", "system volume information",
          "lost+found", "icon\r"}

# Reasons a file is not converted (keys of the manifest's "not_converted"), and how the summary line says them.
REASONS = {
    "os_or_hidden": "hidden or OS entries (.DS_Store, ._*, __MACOSX, Thumbs.db, ...)",
    "not_an_image": "files that are not images tfgpu converts (by extension)",
    "outside_class_folder": "images outside a class folder",
    "unlabelled_split": "images in a split folder without class folders (unlabelled)",
    "symlink_loop": "symlinks inside or around their own class folder, or to a folder already visited (loops, "
                    "copies)",
    "symlink_to_other_class": "symlinks into or around another class or split folder",
    "symlink_to_taken_image": "images reached again through symlinks (each image is converted once, in the class "
                              "that reaches it first in sorted order)",
    "unreadable_folder": "folders that cannot be listed",
}


def display(path: str) -> str:
    """``path`` as printable text: bytes that are not UTF-8 (from the file system) shown as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace") if isinstance(path, str) else str(path)


def is_debris(name: str) -> bool:
    return name.startswith(".") or name.lower() in DEBRIS


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _within(parent: str, path: str) -> bool:
    """``path`` is ``parent`` or below it (both real paths)."""
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


@dataclasses.dataclass
class FolderScan:
    """What a folder holds: per split, {class: [image paths relative to root]}; what was left out and why."""
    root: str
    presplit: bool
    splits: dict
    not_converted: dict  # reason -> [paths]
    notices: list  # one line each: layout decisions a user should hear about
    followed_outside: list  # images taken through a link that leads outside their class folder


class _Scanner:
    def __init__(self, root):
        self.root = root
        self.not_converted = {}
        self.followed_outside = []
        self.taken_through_links = set()  # real paths of images taken through links, across all class folders

    def skip(self, reason, path):
        self.not_converted.setdefault(reason, []).append(path)

    def entries(self, directory):
        """Sorted (name, is_dir, is_link) of ``directory``; debris and unreadable folders are recorded."""
        try:
            with os.scandir(directory) as it:
                listed = []
                for e in it:
                    try:
                        listed.append((e.name, e.is_dir(), e.is_symlink()))
                    except OSError:
                        listed.append((e.name, False, True))
        except OSError:
            self.skip("unreadable_folder", directory)
            return []
        kept = []
        for name, is_dir, is_link in sorted(listed):
            if is_debris(name):
                self.skip("os_or_hidden", os.path.join(directory, name))
            else:
                kept.append((name, is_dir, is_link))
        return kept

    def class_images(self, class_dir, others):
        """Image paths (relative to root) below ``class_dir``; ``others`` are the real paths of the other class
        folders and split folders, which no link may lead into or around."""
        home = os.path.realpath(class_dir)
        seen, found = {home}, []

        def link_reason(target):
            """Why a link resolving to ``target`` is not followed, or None."""
            if _within(home, target) or _within(target, home) or target in seen:
                return "symlink_loop"  # taken anyway, or contains the class folder, or visited: a loop or a copy
            if any(_within(o, target) or _within(target, o) for o in others):
                return "symlink_to_other_class"
            return None

        def walk(directory, real, outside):
            for name, is_dir, is_link in self.entries(directory):
                path = os.path.join(directory, name)
                if not is_dir and not is_image_name(name):
                    self.skip("not_an_image", path)
                    continue
                target = os.path.realpath(path) if is_link else os.path.join(real, name)
                reason = link_reason(target) if is_link else None
                if reason:
                    self.skip(reason, path)
                elif is_dir:
                    seen.add(target)
                    walk(path, target, outside or is_link)
                else:
                    rel = os.path.relpath(path, self.root)
                    if outside or is_link:
                        # Images outside every class folder can be reached by several links (from one class or
                        # from two): each is converted once, never twice and never under two labels.
                        real_image = os.path.realpath(path)
                        if real_image in self.taken_through_links:
                            self.skip("symlink_to_taken_image", path)
                            continue
                        self.taken_through_links.add(real_image)
                        self.followed_outside.append(rel)
                    found.append(rel)

        walk(class_dir, home, False)
        return found

    def loose_files(self, directory, entries, reason):
        for name, is_dir, _ in entries:
            if not is_dir:
                self.skip(reason if is_image_name(name) else "not_an_image", os.path.join(directory, name))


def _check_utf8(path):
    try:
        os.path.basename(path).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("source", f"{display(path)}: a class folder name must be UTF-8 text (class names go into "
                          "dataset.json); rename it") from None


def scan_folder(root: str) -> FolderScan:
    """Finds the layout, classes and images of an image folder (see the module docstring for the rules)."""
    root = os.path.abspath(root)
    scanner = _Scanner(root)
    top = scanner.entries(root)
    if not top and scanner.not_converted.get("unreadable_folder"):
        raise ConfigError("source", f"{root}: cannot list the folder (permissions?)")
    top_dirs = [name for name, is_dir, _ in top if is_dir]
    split_named = [d for d in top_dirs if d in SPLIT_FOLDERS]
    other = [d for d in top_dirs if d not in SPLIT_FOLDERS]
    notices = []
    if split_named and other:
        raise ConfigError("source", f"{root} is ambiguous: it has split folders ({', '.join(split_named)}) and "
                          f"other folders ({', '.join(other[:5])}{' ...' if len(other) > 5 else ''}); use "
                          f"{root}/<class>/ or {root}/<split>/<class>/ (splits: {', '.join(SPLIT_FOLDERS)}), or "
                          "list the images in a CSV")
    presplit = bool(split_named)
    split_dirs = {}
    if presplit:
        scanner.loose_files(root, top, "outside_class_folder")
        for split in split_named:
            directory = os.path.join(root, split)
            entries = scanner.entries(directory)
            if any(is_dir for _, is_dir, _ in entries):
                split_dirs[split] = (directory, entries)
                continue
            images = [os.path.join(directory, n) for n, _, _ in entries if is_image_name(n)]
            scanner.loose_files(directory, entries, "unlabelled_split")
            notices.append(f"skipping {split}/: " + (f"its {len(images)} image(s) are not in class folders, so "
                                                     "they have no labels" if images else "no class folders"))
    else:
        split_dirs["train"] = (root, top)
    class_dirs = {}
    for split, (directory, entries) in split_dirs.items():
        scanner.loose_files(directory, entries, "outside_class_folder")
        for name, is_dir, is_link in entries:
            if is_dir:
                _check_utf8(os.path.join(directory, name))
                class_dirs[(split, name)] = (os.path.join(directory, name), is_link)
    reals = {key: os.path.realpath(path) for key, (path, _) in class_dirs.items()}
    split_reals = {s: os.path.realpath(d) for s, (d, _) in split_dirs.items()}
    splits = {}
    for (split, name), (path, is_link) in class_dirs.items():
        others = [r for k, r in reals.items() if k != (split, name)]
        others += [r for s, r in split_reals.items() if s != split]
        images = []
        if is_link and any(_within(o, reals[split, name]) or _within(reals[split, name], o) for o in others):
            scanner.skip("symlink_to_other_class", path)  # a class folder that is another one under a new name
        else:
            images = scanner.class_images(path, others)
        splits.setdefault(split, {})[name] = images
    for split in list(splits):
        if not any(splits[split].values()):
            notices.append(f"skipping {split}/: its class folders hold no images")
            del splits[split]
    return FolderScan(root, presplit, splits, scanner.not_converted, notices, scanner.followed_outside)
