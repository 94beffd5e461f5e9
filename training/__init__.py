"""Retrain's training room: HOW a model is trained.

The code the pipeline steps run: sample data, preparation, the checkpoint-resuming DDP trainer and its
stores. It knows nothing of Azure Functions or Event Grid, and can be run and tested on its own.
"""

__version__ = "0.1.0"
