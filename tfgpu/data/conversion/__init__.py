"""The converter (``python -m tfgpu.convert``): the plan and its writes (``convert``), one example encoded into
one record (``encode``), the shard writers' processes (``workers``), the output directory's safe, resumable
writes (``outdir``) and the ``dataset.json`` whose counts must add up (``manifest``)."""
