"""The ``dataset.json`` a conversion writes (its schema: docs/datasets.md; read by ``tfrecord``/``catalog``), built
from what the shard writers report, with the counts checked to add up."""
from tfgpu.data.sources.folders import display

MAX_LISTED = 1000  # paths listed per reason under the manifest's not_converted (the count is always exact)

ADJUSTED = {"exif_orientation_applied": "turned upright by their EXIF orientation",
            "tiff_as_png": "TIFF stored as PNG (TensorFlow cannot decode TIFF)",
            "unreadable_at_dataset_channels_as_png": "BMP/GIF/WebP stored as PNG (TensorFlow cannot decode them at "
                                                     "the dataset's channels)"}


def _listed(paths) -> dict:
    return {"count": len(paths), "paths": [display(p) for p in paths[:MAX_LISTED]]}


def build(o, source, splits, tasks, results, enc, fingerprint) -> dict:
    """``dataset.json`` of a conversion from its shard writers' results, checking that the counts add up (every
    source example is a record or listed as skipped)."""
    split_entries, skipped, adjusted = {}, [], {}
    h, w, channels = [None, None, 0], [None, None, 0], {}
    for split, data in splits.items():
        mine = [(t, r) for t, r in zip(tasks, results) if t["split"] == split]
        class_counts = {str(i): 0 for i in range(len(source.classes))}
        num_examples = num_skipped = 0
        for t, r in mine:
            st = r["stats"]
            if st["num_examples"] + len(st["skipped"]) != t["num_sources"] or \
                    st["num_examples"] != r["entry"]["num_examples"]:
                raise RuntimeError(f"{r['entry']['file']}: {st['num_examples']} records + {len(st['skipped'])} "
                                   f"skipped != {t['num_sources']} sources")
            num_examples += st["num_examples"]
            num_skipped += len(st["skipped"])
            skipped.extend({**s, "split": split} for s in st["skipped"])
            for label, n in st["class_counts"].items():
                class_counts[label] = class_counts.get(label, 0) + n
            for acc, part in ((h, st["height"]), (w, st["width"])):
                if part[0] is not None:
                    acc[0] = part[0] if acc[0] is None else min(acc[0], part[0])
                    acc[1] = part[1] if acc[1] is None else max(acc[1], part[1])
                    acc[2] += part[2]
            for c, n in st["channels"].items():
                channels[c] = channels.get(c, 0) + n
            for k, n in st.get("adjusted", {}).items():
                adjusted[k] = adjusted.get(k, 0) + n
        if num_examples + num_skipped != len(data):
            raise RuntimeError(f"split {split}: {num_examples} examples + {num_skipped} skipped != {len(data)}")
        split_entries[split] = {"num_examples": num_examples, "num_skipped": num_skipped, "num_sources": len(data),
                                "shards": [r["entry"] for _, r in mine], "class_counts": class_counts}
    total = sum(e["num_examples"] for e in split_entries.values())
    image_shape = {"channels": max((int(c) for c in channels), default=source.channels or 0),
                   "channels_seen": channels}
    if total:
        image_shape.update(height_min=h[0], height_max=h[1], height_mean=round(h[2] / total, 2),
                           width_min=w[0], width_max=w[1], width_mean=round(w[2] / total, 2))
        if h[0] == h[1] and w[0] == w[1]:
            image_shape.update(height=h[0], width=w[0])
    return {
        "name": source.name, "source": display(o.source), "source_kind": source.kind, "classes": list(source.classes),
        "splits": split_entries, "compression": o.compression,
        "image_format": o.image_format if source.encoded or o.image_format != "keep" else "png",
        "image_shape": image_shape, "skipped": skipped, "num_skipped": len(skipped), "adjusted": adjusted,
        "not_converted": {reason: _listed(paths) for reason, paths in source.not_converted.items()},
        "followed_symlinks_outside_class": _listed(source.followed_outside), "notices": list(source.notices),
        "converter": {"fingerprint": fingerprint, "seed": o.seed, "split": o.split, "resize": o.resize,
                      "jpeg_quality": o.jpeg_quality if o.image_format == "jpeg" else None,
                      "channels": enc.channels or None},
    }
