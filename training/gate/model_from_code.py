"""What MLflow runs to get a registered version's model (its "models from code" form): the task-driven
pyfunc of training/gate/pyfunc_model.py. Loading runs this file, never unpickles code."""

from mlflow.models import set_model

from training.gate.pyfunc_model import TaskModel

set_model(TaskModel())
