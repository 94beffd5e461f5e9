"""Helpers of the training tests: the small run, task files loaded by path, harnesses and a registry node."""
