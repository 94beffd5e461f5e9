"""Helpers of the infrastructure tests: the Bicep reader, its checks against the code and ARM, checkov."""
