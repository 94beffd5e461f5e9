"""`retrain serve NAME`: the champion behind MLflow's own scoring server, pointed at the right store.

`mlflow models serve -m models:/NAME@champion` finds the registry through MLFLOW_TRACKING_URI and
MLFLOW_REGISTRY_URI; run by hand in a shell that has neither, it looks in ./mlruns and finds nothing. This
command resolves the store as every `retrain` registry command does (`--mlflow-tracking-uri`, else
$MLFLOW_TRACKING_URI, else the local state folder's SQLite store), checks that the model has a champion
there, and then becomes the server: the process is replaced by `python -m mlflow models serve` with both
variables set, so a signal to `retrain serve` reaches the server itself, and a user's credentials for a
remote store travel in the environment, never on a command line. The model runs in this environment
(`--env-manager local`): the one it was trained and registered from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError
from core.names import check_model_name
from training.gate.registry import CHAMPION, MlflowStore, ModelRegistry, displayable_uri

_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@dataclass(frozen=True)
class ServeCommand:
    """The server's command line and environment, and the version it serves."""

    argv: tuple[str, ...]
    environ: Mapping[str, str]
    version: str
    url: str


def serve_command(
    store: MlflowStore, model_name: str, host: str, port: int, workers: int, environ: Mapping[str, str]
) -> ServeCommand:
    """How to serve `model_name`'s champion from `store`; refused in one line when it has none."""
    check_model_name(model_name, "retrain serve NAME")
    if not 1 <= port <= 65535:
        raise InputError(f"--port {port}: expected a TCP port from 1 to 65535")
    if workers < 1:
        raise InputError(f"--workers {workers}: expected a number of server processes >= 1")
    champion = ModelRegistry(store).alias_holder(model_name, CHAMPION)
    if champion is None:
        raise InputError(
            f"retrain serve {model_name}: no version of model {model_name!r} holds the {CHAMPION!r} alias in "
            f"the MLflow registry at {displayable_uri(store.tracking_uri)}; `retrain models --model-name "
            f"{model_name}` lists its versions, `retrain run --model-name {model_name}` trains one"
        )
    model_uri = f"models:/{model_name}@{CHAMPION}"
    argv = (sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local")
    argv += ("--host", host, "--port", str(port), "--workers", str(workers))
    # MLflow's CLI starts `uvicorn` by name: this interpreter's scripts come first on PATH, so the server
    # runs from the environment the model was registered from even when it is not activated.
    path = os.pathsep.join(part for part in (str(Path(sys.executable).parent), environ.get("PATH")) if part)
    served = {**environ, **dict.fromkeys(_URI_VARIABLES, store.tracking_uri), "PATH": path}
    shown_host = f"[{host}]" if ":" in host else host
    return ServeCommand(argv, served, champion.version, f"http://{shown_host}:{port}")


def become_server(command: ServeCommand) -> None:
    """Replace this process by the server (it never returns)."""
    # No shell: the argv is this interpreter and fixed words, the model name checked, the port a number.
    os.execve(command.argv[0], list(command.argv), dict(command.environ))  # noqa: S606
