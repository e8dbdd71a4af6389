"""Where a run is in its data, and in which order it reads it: the seeded order of an epoch's chunks over the
workers (``order``, ``chunks``), the data position a checkpoint records (``position``, ``input_position``) and
where a resumed run starts reading (``resume``). Pure functions of the seed and the position: no iterator state."""
