"""Result files (summary.json, steps.csv, samples.csv): writing, reading, and showing them on the console."""
