"""The benchmark models. Each module implements mtbench's Workload interface or builds a network for one.

mtbench never imports this package by name: conf/model/<name>.yaml points at the classes with `_target_`.
"""
