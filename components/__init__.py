"""Retrain's pipeline definition: WHAT runs.

Azure ML component specs (prep, train, evaluate, register), the training environment and compute specs,
and the builders that load them. The steps call into `training/` by command line only, never by import,
so a step's code and the pipeline's definition version independently.
"""
