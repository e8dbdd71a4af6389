"""Trainer-level resume cost (issue 40's measure): the ``startup`` record's ``first_loop_s`` of a run resumed
mid-epoch and at the epoch's end, on the same topology and on another, against a fresh run's; each resume
audited by ``tfgpu.audit_input`` (0 records fed twice, 0 never).

    python tools/bench_resume.py --data_dir=/tmp/i40/bench/raw16-1000000 --work_dir=/tmp/bench_resume \\
        --repeats=2 --output=/tmp/bench_resume.json

The recipe: a tiny model (``TINY_MODEL`` below, a linear classifier written to the work dir, so the input is what
is measured) trained at
``--global_batch_size=1024 --checkpoint_every_steps=0 --eval_split=none`` to step M (mid-epoch) and on to step E
(the epoch's last step: the records of step E+1 cross into the next epoch) on one worker: copies of those model
dirs are the checkpoints resumed. Every round runs each case once, interleaved, from a fresh copy: ``fresh``
(``--train_steps=K`` from nothing), ``mid`` and ``end`` (``--train_steps=M+K`` / ``E+K`` on a copy), and the same
on ``--workers`` workers through ``tfgpu.launch`` (``fresh_Nw``, ``mid_Nw``, ``end_Nw``: a resume on another
number of input pipelines). So each first loop is K steps, tracing included. Each run's process CPU seconds
(children's user + system) are printed too: on a shared host they vary less than wall time.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT)  # after PYTHONPATH: --pipeline_only measures the tfgpu it names (another checkout, say)
BATCH = 1024


TINY_MODEL = '''"""A linear classifier: the step costs next to nothing, so a first loop is the input's start and tracing."""


def tiny(input_shape, num_classes):
    import keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)])
'''


def model_file(work_dir: str) -> str:
    """The tiny model's file in ``work_dir``: one path for the runs that made the checkpoints and those resuming
    them, wherever this script is run from (a resume refuses another --model)."""
    path = os.path.join(work_dir, "tiny_model.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(TINY_MODEL)
    return path


def steps_of(records: int, batch: int, workers: int = 1):
    """(mid-epoch step, the epoch's last step) of a run over ``records`` at global batch ``batch``: the step whose
    records end halfway, and the last step whose records all lie in the first epoch."""
    per_epoch = (records // workers) * workers // batch
    return per_epoch // 2, per_epoch


def startup_record(model_dir: str) -> dict:
    """The last ``startup`` record of ``model_dir``'s history.jsonl (the run just made)."""
    from tfgpu.metrics import history

    found = [r for r in history.read(model_dir) if r.get("kind") == "startup"]
    if not found:
        raise RuntimeError(f"{model_dir}: its history has no startup record")
    return found[-1]


def train_flags(data_dir: str, model_dir: str, steps: int, cache_dir: str, model: str) -> list:
    return [f"--data_dir={data_dir}", f"--model={model}:tiny", f"--global_batch_size={BATCH}",
            "--checkpoint_every_steps=0", "--eval_split=none", f"--train_steps={steps}", f"--model_dir={model_dir}",
            f"--data_cache_dir={cache_dir}", "--verbose=2"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run(command: list, log_path: str, timeout: float) -> tuple:
    """Runs ``command`` (output to ``log_path``); (wall seconds, CPU seconds of the finished children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=_env(), timeout=timeout).returncode
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code:
        raise RuntimeError(f"exit {code}: {' '.join(command)} (see {log_path})")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def train(data_dir: str, model_dir: str, steps: int, workers: int, cache_dir: str, log_path: str, timeout: float,
          model: str):
    flags = train_flags(data_dir, model_dir, steps, cache_dir, model)
    if workers > 1:
        command = [sys.executable, "-m", "tfgpu.launch", f"--num_workers={workers}", "--", *flags]
    else:
        command = [sys.executable, "-m", "tfgpu.train", *flags]
    return run(command, log_path, timeout)


def audit(data_dir: str, workers: int, step: int, cache_dir: str, out: str, timeout: float) -> dict:
    """``tfgpu.audit_input`` of a resume at ``step`` from one worker onto ``workers`` (one epoch after it), or of
    one fresh epoch (``step`` 0): its epochs' counts, wall and CPU seconds."""
    command = [sys.executable, "-m", "tfgpu.audit_input", f"--data_dir={data_dir}", f"--num_workers={workers}",
               f"--global_batch_size={BATCH}", f"--data_cache_dir={cache_dir}", "--epochs=1", f"--output_json={out}"]
    if step:
        command += [f"--resume_from_step={step}", "--previous_num_workers=1"]
    wall, cpu = run(command, out + ".log", timeout)
    with open(out) as f:
        result = json.load(f)
    return {"epochs": result["epochs"], "wall_s": wall, "cpu_s": cpu}


def pipeline_costs(data_dir: str, cache_dir: str, steps, workers: int) -> list:
    """In this process, CPU and wall seconds of the start's parts for a run resumed at each of ``steps`` from one
    worker onto ``workers`` (1: the same topology): ``catalog.prepare``, the resume plan (``plan_resume``), building
    pipeline 0's dataset and its first batch; after one untimed fresh pipeline (its first batch read)."""
    import tensorflow as tf

    from tfgpu.config import Config, DatasetConfig
    from tfgpu.data import catalog
    from tfgpu.data.index import position, resume
    from tfgpu.data.input import pipeline
    from tfgpu.tasks.registry import input_config

    config = Config(model_dir="unused", data_dir=data_dir, global_batch_size=BATCH, data_cache_dir=cache_dir)
    warm = catalog.prepare(DatasetConfig.of(config))  # untimed: the shard checks cached, TensorFlow's first ops run
    next(iter(pipeline.train_dataset_fn(input_config(config), warm, 0)(tf.distribute.InputContext())))
    rows = []
    for step in steps:
        marks = [(time.process_time(), time.perf_counter())]

        def mark():
            marks.append((time.process_time(), time.perf_counter()))

        info = catalog.prepare(DatasetConfig.of(config))
        mark()
        inputs = input_config(config)
        recorded = position.from_step(step, position.Topology(1, 1, BATCH, 1), info.num_train_examples)
        plan = resume.plan_resume(inputs, info, workers, step, recorded)
        mark()
        ds = pipeline.train_dataset_fn(inputs, info, step, plan=plan)(tf.distribute.InputContext(workers, 0, workers))
        mark()
        next(iter(ds))
        mark()
        parts = ("prepare", "plan", "build", "first_batch")
        rows.append({"step": step, "workers": workers,
                     **{f"{p}_cpu_s": b[0] - a[0] for p, a, b in zip(parts, marks, marks[1:])},
                     **{f"{p}_wall_s": b[1] - a[1] for p, a, b in zip(parts, marks, marks[1:])}})
    return rows


def summarize(rounds: dict) -> dict:
    """Per case: the medians of its rounds' first loops and CPU seconds, and their difference from the fresh
    run's on the same number of workers."""
    rows = {}
    for case, runs in rounds.items():
        rows[case] = {"first_loop_s": statistics.median(r["first_loop_s"] for r in runs),
                      "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                      "rounds": [(round(r["first_loop_s"], 2), round(r["cpu_s"], 1)) for r in runs]}
    for case, row in rows.items():
        topology = case.partition("_")[2]  # "" or "2w"
        fresh = rows.get(f"fresh_{topology}" if topology else "fresh")
        if fresh is not None and not case.startswith("fresh"):
            row["vs_fresh_s"] = row["first_loop_s"] - fresh["first_loop_s"]
            row["cpu_vs_fresh_s"] = row["cpu_s"] - fresh["cpu_s"]
    return rows


def table(rows: dict, audits: dict) -> str:
    lines = ["| case | first loop, s (median) | vs fresh, s | process CPU, s (median) | vs fresh, s | rounds "
             "(first loop s, CPU s) | audit: missing / duplicated |", "|---|---:|---:|---:|---:|---|---|"]
    for case, row in rows.items():
        found = audits.get(case)
        checked = ("; ".join(f"epoch {e['epoch']}: {e['missing']} / {e['duplicated']}" for e in found["epochs"])
                   if found else "")
        lines.append(f"| {case} | {row['first_loop_s']:.2f} | {row.get('vs_fresh_s', 0):+.2f} | {row['cpu_s']:.1f} | "
                     f"{row.get('cpu_vs_fresh_s', 0):+.1f} | {row['rounds']} | {checked} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", required=True, help="A converted dataset (train split read).")
    p.add_argument("--records", type=int, default=0, help="Its train records; 0 = read from dataset.json.")
    p.add_argument("--work_dir", default="/tmp/tfgpu_bench_resume", help="Checkpoints, copies, logs (kept).")
    p.add_argument("--workers", type=int, default=2, help="Workers of the other topology; 0 or 1 = none.")
    p.add_argument("--first_loop_steps", type=int, default=10, help="Steps each measured run trains (its first loop).")
    p.add_argument("--repeats", type=int, default=2, help="Interleaved rounds.")
    p.add_argument("--timeout", type=float, default=3600, help="Seconds any one command may take.")
    p.add_argument("--pipeline_only", action="store_true", help="Time the start's parts in this process instead "
                   "(catalog.prepare, the resume plan, building the pipeline, its first batch; CPU and wall), fresh, "
                   "mid-epoch and at the epoch's end, on 1 worker and --workers, for the tfgpu on PYTHONPATH.")
    p.add_argument("--output", default="", help="Write the results as JSON here.")
    o = p.parse_args(argv)
    if not o.records:
        with open(os.path.join(o.data_dir, "dataset.json")) as f:  # the manifest (tfrecord.MANIFEST)
            o.records = json.load(f)["splits"]["train"]["num_examples"]
    records = o.records
    mid, end = steps_of(records, BATCH)
    cache, logs = os.path.join(o.work_dir, "cache"), os.path.join(o.work_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    model = model_file(o.work_dir)
    print(f"{records} records, global batch {BATCH}: mid-epoch step {mid}, the epoch's end step {end}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    if o.pipeline_only:
        import tfgpu

        print(f"tfgpu from {os.path.dirname(tfgpu.__file__)}", flush=True)
        rows = []
        for workers in sorted({1, max(1, o.workers)}):
            for row in pipeline_costs(o.data_dir, cache, (0, mid, end), workers):
                rows.append(row)
                print(f"step {row['step']} on {workers} pipeline(s), CPU s (wall s): prepare {row['prepare_cpu_s']:.2f} "
                      f"({row['prepare_wall_s']:.1f}), plan {row['plan_cpu_s']:.2f} ({row['plan_wall_s']:.1f}), "
                      f"build {row['build_cpu_s']:.2f} ({row['build_wall_s']:.1f}), first batch "
                      f"{row['first_batch_cpu_s']:.2f} ({row['first_batch_wall_s']:.1f})", flush=True)
        if o.output:
            with open(o.output, "w") as f:
                json.dump({"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "rows": rows}, f,
                          indent=2)
        return 0
    base, saved = os.path.join(o.work_dir, "base"), {}
    for name, step in (("mid", mid), ("end", end)):
        saved[name] = os.path.join(o.work_dir, f"at-{step}")
        if not os.path.exists(os.path.join(saved[name], "history.jsonl")):
            wall, _ = train(o.data_dir, base, step, 1, cache, os.path.join(logs, f"base-{step}.log"), o.timeout,
                            model)
            shutil.rmtree(saved[name], ignore_errors=True)
            shutil.copytree(base, saved[name])
            print(f"trained to step {step} on 1 worker in {wall:.0f} s: {saved[name]}", flush=True)
    cases = [("fresh", 0, 1), ("mid", mid, 1), ("end", end, 1)]
    if o.workers > 1:
        cases += [(f"{name}_{o.workers}w", step, o.workers) for name, step, _ in cases]
    rounds = {name: [] for name, _, _ in cases}
    for r in range(o.repeats):
        for name, step, workers in cases:
            model_dir = os.path.join(o.work_dir, "runs", name)
            shutil.rmtree(model_dir, ignore_errors=True)
            if step:
                shutil.copytree(saved["mid" if step == mid else "end"], model_dir)
            _, cpu = train(o.data_dir, model_dir, step + o.first_loop_steps, workers, cache,
                           os.path.join(logs, f"{name}-{r}.log"), o.timeout, model)
            first = startup_record(model_dir)["first_loop_s"]
            rounds[name].append({"first_loop_s": first, "cpu_s": cpu, "load": os.getloadavg()[0]})
            print(f"round {r + 1} {name}: first loop {first:.2f} s, process CPU {cpu:.1f} s, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    audits = {}
    for name, step, workers in cases:
        audits[name] = audit(o.data_dir, workers, step, cache, os.path.join(logs, f"audit-{name}.json"), o.timeout)
        print(f"audit {name}: {audits[name]['epochs']} ({audits[name]['wall_s']:.1f} s wall, "
              f"{audits[name]['cpu_s']:.1f} s CPU)", flush=True)
    rows = summarize(rounds)
    print(table(rows, audits), flush=True)
    if o.output:
        with open(o.output, "w") as f:
            json.dump({"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "records": records,
                       "mid_step": mid, "end_step": end, "rows": rows, "rounds": rounds, "audits": audits}, f, indent=2)
    bad = [n for n, a in audits.items() for e in a["epochs"] if e["missing"] or e["duplicated"]]
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
