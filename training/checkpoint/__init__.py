"""Checkpoints: durable stores behind one small protocol, and the asynchronous checkpointer."""
