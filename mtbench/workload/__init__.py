"""The Workload interface every model implements, memory plans as values, block partitions, the memory breakdown."""
