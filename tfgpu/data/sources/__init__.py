"""Where a conversion's examples come from: every kind of ``--source`` (``source_formats``), the ``Source`` and its
splits (``source``), and one module per kind of input: image folders, CSV/TSV lists, built-in arrays, TFDS
builders, other tools' TFRecords (``folders``, ``csvlist``, ``builtin``, ``tfds_source``, ``foreign``)."""
