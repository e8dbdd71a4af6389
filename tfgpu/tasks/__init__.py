"""Tasks: what a training step computes (classification, gan)."""
