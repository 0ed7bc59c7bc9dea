"""Where batches come from: the source interface (base), synthetic data, and loaders of the real sets' files."""
