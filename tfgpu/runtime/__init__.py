"""Where a run executes: cluster membership, the tf.distribute strategy, precision, logging, crash-safe files."""
