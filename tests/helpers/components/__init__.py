"""Helpers of the components tests: fakes of the Azure side, the quick pipeline, run requests, task files."""
