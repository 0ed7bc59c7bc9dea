"""One job from start to end: its lock, its process, its timed steps, its result files."""
