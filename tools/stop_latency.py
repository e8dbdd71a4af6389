"""Times a stop: from a signal to the checkpoint on disk and to the process's exit (docs/resuming.md, "Stopping").

    python tools/stop_latency.py --model_dir=/tmp/long --delay_s=25 --signal=SIGTERM -- \\
        --flagfile=configs/quickstart.flags --train_steps=40000 --steps_per_loop=20000 --eval_every_steps=0

Starts ``python -m tfgpu.train ARGS --model_dir=DIR``, waits until its log shows the model built (``params=``),
then ``--delay_s`` more, sends the signal, and prints one JSON line: the exit code, the newest checkpoint, the
seconds from the signal to that checkpoint's ``.index`` file (its modification time) and to the exit, and
whether the output held a traceback; then the run's last lines, timed from the signal.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # tfgpu from this checkout
from tfgpu.runtime import run_dir  # noqa: E402 (after the checkout is on the path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--delay_s", type=float, default=25.0, help="seconds after the model is built")
    parser.add_argument("--signal", default="SIGTERM", choices=["SIGTERM", "SIGINT"])
    parser.add_argument("train_args", nargs="*", help="flags of python -m tfgpu.train (after --)")
    args = parser.parse_args(argv)
    proc = subprocess.Popen([sys.executable, "-m", "tfgpu.train", *args.train_args, f"--model_dir={args.model_dir}"],
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines, built = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip()))
            if "params=" in line:
                built.set()
        built.set()

    reader = threading.Thread(target=read)
    reader.start()
    built.wait(1800)
    if proc.poll() is not None:
        print("\n".join(line for _, line in lines[-20:]), file=sys.stderr)
        return 1
    time.sleep(args.delay_s)
    sent = time.time()
    proc.send_signal(getattr(signal, args.signal))
    proc.wait(timeout=1800)
    ended = time.time()
    reader.join()
    directory = run_dir.checkpoints(args.model_dir)
    index = [os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".index")] \
        if os.path.isdir(directory) else []
    newest = max(index, key=os.path.getmtime) if index else None
    print(json.dumps({"exit_code": proc.returncode, "checkpoint": os.path.basename(newest)[:-6] if newest else None,
                      "signal_to_checkpoint_s": round(os.path.getmtime(newest) - sent, 2) if newest else None,
                      "signal_to_exit_s": round(ended - sent, 2),
                      "traceback": any("Traceback" in line for _, line in lines)}))
    for at, line in lines[-5:]:
        print(f"  {at - sent:+7.2f}s {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
