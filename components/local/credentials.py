"""A step's credentials travel in its environment, never on its command line.

A command line is readable by every user of the machine (`ps`), and the local runner writes it into the
step's log and the run's record. Two inputs may carry one:
- the train step's MLflow tracking URI (`--param mlflow_tracking_uri=https://user:password@host`): the step
  gets the URI without its user info, and the user info in MLflow's own MLFLOW_TRACKING_USERNAME /
  MLFLOW_TRACKING_PASSWORD, which MLflow sends as basic auth;
- the task's options, whose secrets (core/task_ref.py) the `task_options` input holds as `***`: their
  values go in RETRAIN_TASK_SECRETS, from which the step's loader takes them.
What is written about the run is masked besides (core.secrets.mask_secrets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.secrets import tracking_credentials_apart
from core.task_ref import task_secrets_environment

TRACKING_URI_INPUT = "mlflow_tracking_uri"


def credentials_apart(
    inputs: Mapping[str, Any], task_options: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A step's input values for its command line, and the environment variables that carry the
    credentials taken out of them and the task's secrets (over those of `environ`, the runner's)."""
    secrets = task_secrets_environment(task_options, environ)
    value = inputs.get(TRACKING_URI_INPUT)
    if not isinstance(value, str):
        return dict(inputs), secrets
    uri, environment = tracking_credentials_apart(value)
    return {**inputs, TRACKING_URI_INPUT: uri}, {**environment, **secrets}
