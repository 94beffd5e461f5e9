"""Helpers of the front door tests: event corpora, app settings, and harnesses run in fresh processes."""
