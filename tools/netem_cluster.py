"""The emulated cluster network's command line (``python tools/netem_cluster.py up|shape|run|status|down``); the
library is ``tfgpu.bench.netem``, where its documentation is."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tfgpu.bench import netem  # noqa: E402

if __name__ == "__main__":
    sys.exit(netem.main())
