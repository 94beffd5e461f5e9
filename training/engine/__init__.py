"""The task-agnostic training engine: the loop, DDP, sampling, preemption, consensus, progress, tracking."""
