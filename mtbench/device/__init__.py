"""The device a job runs on: which one, its synchronization and out-of-memory errors, its memory peak and cap, and what it is."""
