"""What a run leaves behind while it trains: the run directory, metrics, checkpoints, final weights, merging."""
