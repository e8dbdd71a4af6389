"""What a finished (or crashed) run leaves for people: the markdown report and its plots."""
