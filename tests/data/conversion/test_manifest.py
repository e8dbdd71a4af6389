"""dataset.json's counts add up or the conversion stops: a shard writer's stats that lose an example are refused."""
import types

import pytest

from tfgpu.data.conversion import manifest


def _stats(n, skipped=0, labels=None):
    return {"num_examples": n, "skipped": [{"path": f"bad{i}.png", "reason": "unreadable"} for i in range(skipped)],
            "class_counts": labels or {"0": n}, "height": [8, 8, 8 * n], "width": [8, 8, 8 * n],
            "channels": {"1": n}}


def _build(shards):
    """shards: (num_sources, stats, entry_count) per train shard."""
    options = types.SimpleNamespace(source="/data/digits", compression="none", image_format="png", seed=1,
                                    split="", resize="", jpeg_quality=95)
    source = types.SimpleNamespace(name="digits", kind="folder", classes=("0", "1"), channels=1, encoded=True,
                                   not_converted={}, followed_outside=[], notices=[])
    tasks = [{"split": "train", "num_sources": n} for n, _, _ in shards]
    results = [{"stats": st, "entry": {"file": f"train-{i}", "num_examples": count}}
               for i, (_, st, count) in enumerate(shards)]
    total = sum(n for n, _, _ in shards)
    return manifest.build(options, source, {"train": range(total)}, tasks, results, types.SimpleNamespace(channels=1),
                          "fp")


def test_counts_that_add_up_give_the_split_its_examples_skips_and_class_counts():
    written = _build([(3, _stats(3, labels={"0": 2, "1": 1}), 3), (4, _stats(3, skipped=1, labels={"1": 3}), 3)])
    train = written["splits"]["train"]
    assert (train["num_examples"], train["num_skipped"], train["num_sources"]) == (6, 1, 7)
    assert train["class_counts"] == {"0": 2, "1": 4} and written["num_skipped"] == 1
    assert written["image_shape"]["height"] == 8 and written["image_shape"]["channels"] == 1


@pytest.mark.parametrize("shard", [(4, _stats(3), 3), (3, _stats(3), 2)], ids=["lost-example", "entry-disagrees"])
def test_a_shard_whose_counts_do_not_add_up_stops_the_conversion(shard):
    with pytest.raises(RuntimeError, match="train-0"):
        _build([shard])
