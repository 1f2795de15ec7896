"""`provision tune` (issue 19, in progress): hyperparameter sweeps of the reference trainer
over the cluster, on Optuna. Built so far: the search-space file (space.py) and the queue
that feeds trials to free slots (slots.py); the command itself is not wired yet."""
