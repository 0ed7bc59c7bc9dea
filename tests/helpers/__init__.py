"""Helpers shared by the tests: composing the real config, fake workload overrides, subprocess environments."""
