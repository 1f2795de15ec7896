"""`provision tune` (issue 19, in progress): hyperparameter sweeps of the reference trainer
over the cluster, on Optuna. Built so far: the search-space file (space.py), the queue
that feeds trials to free slots (slots.py), and the trainer's side of pruning (its
--stop-file: every rank stops after the evaluation that finds the file, exit 0, the
reason in its summary); the command itself is not wired yet."""
