"""What a run leaves behind: the run directory, metrics, checkpoints, exported models, the model card."""
