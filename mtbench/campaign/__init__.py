"""Many jobs: Hydra sweeps and their progress, resuming a sweep, the largest batch that fits."""
