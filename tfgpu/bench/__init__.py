"""The library behind ``python -m tfgpu.benchmark`` (training throughput of tfgpu against plain Keras).

- ``plan``: the checked plan (what to measure) and the Config of one measurement;
- ``runner``: the parent, running each measurement in a child process, auto batch search, the report dict;
- ``case``: the child, one measurement per process (device settings apply once per process);
- ``stats``: window statistics, pooled rounds, ratios, peak TFLOPS and MFU (pure arithmetic);
- ``report``: the printed table.
"""
