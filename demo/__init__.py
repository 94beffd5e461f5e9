"""`retrain demo`: the whole retraining loop on one machine, with no Azure account.

It composes the three rooms as a deployment would: the front door (function_app/) turns landing files and a
drift alert into submissions, the local runner (components/) executes the pipeline's real component
commands, and training/ trains, evaluates, registers and checks drift. Nothing in the rooms knows the demo.
"""
