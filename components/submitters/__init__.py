"""Submitters: the ways a `RunRequest` gets run (components.request.Submitter).

`local.LocalSubmitter` runs the pipeline on this machine, synchronously (the embedded default). The Azure
ML submitter builds the same pipeline from the same YAMLs and submits it to a workspace.
"""
