"""Components the stages are built from: model loading, data formats, kernels, rollout, rewards."""
