"""`provision tune`: hyperparameter sweeps of the reference trainer over the cluster, on
Optuna. ``space`` reads the search-space file; ``study`` makes the Optuna study (journal
storage on the controller, sampler, pruner, the trainer's defaults as the first trial);
``slots`` hands free slots (a node, or one GPU) to trials; ``trial`` runs one trial on one
slot as a one-node train launch and reports its evaluations; ``sweep`` runs the workers,
retries and Ctrl-C; ``results`` keeps the best checkpoint and writes the table and report."""
