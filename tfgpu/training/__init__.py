"""How a run trains: the experiment, the loop, checkpoints, optimizers, history, metric declarations, failures."""
