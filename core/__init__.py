"""Retrain's core: the vocabulary every room speaks, each item written once.

Model names, task references and their options, raw and prepared data versions, the trajectory fields,
blob URLs and secret masking, files written whole, the storage seam and the one error root. Torch-free and
room-free: the standard library and the Blob SDK only (tests/test_architecture.py), so the Function App and
every pipeline step ship it whole.
"""
