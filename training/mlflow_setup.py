"""Open an MLflow store, setting a fresh SQLite one up once, under a lock.

The first use of an MLflow SQLite file creates its tables and runs MLflow's schema migrations, and
MLflow's tracking and registry stores do that without any lock. Two processes meeting there (two
`retrain run`s on a fresh state folder: the train step of one and the train or evaluate step of the other)
both migrate, and one fails ("duplicate column name: step", "No such constraint", or alembic's "expected to
match one row"). So every process opens MLflow through `mlflow_client`: the first time a process opens a
SQLite store, it takes an exclusive lock on `<database>.lock` beside the file, opens the tracking and the
registry store (which creates and migrates them if needed), and lets go. Whoever comes next finds the
tables made. Other stores (a tracking server, Azure ML's workspace) set themselves up, and are opened as
they are.

Creating and migrating the tables costs seconds (1.8 s on a quiet 2-core machine, twice that under load),
paid by every fresh state folder: each `retrain run` on a new machine, each test's store. The schema is a
function of the MLflow version alone, so it is built once per version into a template in the user's cache
(`$RETRAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/retrain`, else `~/.cache/retrain`) and a fresh store starts as
a copy of it (60 ms). The template holds the tables and MLflow's own rows, but not the Default experiment,
whose artifact location names the folder it was made in: MLflow creates that row on first opening, in the
store's own folder, exactly as on a store it migrated itself. A cache that cannot be written only costs the
migration.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from core.files import create_atomically
from core.storage.local import exclusive_file_lock

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

_SQLITE = "sqlite:///"
LOCK_SUFFIX = ".lock"
_ready: set[Path] = set()  # the SQLite files this process has set up or found set up
CACHE_VARIABLE = "RETRAIN_CACHE_DIR"
_DEFAULT_EXPERIMENT_ID = 0  # MLflow's "Default", created on a store's first opening when missing


def sqlite_database(uri: str) -> Path | None:
    """The database file a `sqlite:///` URI names (absolute for `sqlite:////abs`, else relative to the
    working directory); None for other stores and for an in-memory database."""
    if not uri.startswith(_SQLITE):
        return None
    path = uri.removeprefix(_SQLITE).split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path).resolve()


def set_up_store(tracking_uri: str) -> None:
    """Make sure the SQLite store at `tracking_uri` has its tables, creating them under the store's lock.

    Nothing for other stores, for a folder that does not exist (MLflow then reports that itself), or once
    this process has done it."""
    database = sqlite_database(tracking_uri)
    if database is None or database in _ready or not database.parent.is_dir():
        return
    lock = database.with_name(database.name + LOCK_SUFFIX)

    def waiting(holder: str) -> None:
        log.info("waiting for %s to set up the MLflow store %s", holder or "another process", database)

    with exclusive_file_lock(lock, f"pid {os.getpid()}\n", waiting):
        if not database.exists():
            template = schema_template(os.environ)
            if template is not None:
                create_atomically(database, template.read_bytes())
        # Each store creates and migrates its tables when it is constructed, if they are missing.
        _migrate(tracking_uri)
    _ready.add(database)


def cache_folder(environ: Mapping[str, str]) -> Path:
    """Where Retrain keeps what it can rebuild at any time (the MLflow schema template)."""
    if environ.get(CACHE_VARIABLE):
        return Path(environ[CACHE_VARIABLE]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "retrain"


def schema_template(environ: Mapping[str, str]) -> Path | None:
    """An empty SQLite store with this MLflow version's tables, built once per version (each builder in a
    file of its own, renamed into place whole, so racing builders are harmless); None when the cache
    cannot be written, and the store then migrates itself."""
    import mlflow

    folder = cache_folder(environ)
    template = folder / f"mlflow-{mlflow.__version__}-schema.db"
    if template.is_file():
        return template
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".building-") as building:
            database = Path(building) / "schema.db"
            _migrate(f"sqlite:///{database}")
            with sqlite3.connect(database) as connection:
                connection.execute(
                    "DELETE FROM experiment_tags WHERE experiment_id = ?", (_DEFAULT_EXPERIMENT_ID,)
                )
                connection.execute(
                    "DELETE FROM experiments WHERE experiment_id = ?", (_DEFAULT_EXPERIMENT_ID,)
                )
            connection.close()
            os.replace(database, template)
    except (OSError, sqlite3.Error) as error:
        log.debug("no MLflow schema template in %s (%s); the store migrates itself", folder, error)
        return None
    return template


def _migrate(tracking_uri: str) -> None:
    """Create and migrate the tracking and registry tables of the SQLite store at `tracking_uri`."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    client.search_experiments(max_results=1)
    client.search_registered_models(max_results=1)


def mlflow_client(tracking_uri: str, registry_uri: str | None = None) -> MlflowClient:
    """An MlflowClient on a store that is set up (the registry's too, when it is a SQLite file)."""
    from mlflow.tracking import MlflowClient

    set_up_store(tracking_uri)
    if registry_uri is not None and registry_uri != tracking_uri:
        set_up_store(registry_uri)
    return MlflowClient(tracking_uri, registry_uri=registry_uri)


def experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """The id of experiment `name`, created if missing. Two processes may both find it missing and both
    create it: the one that loses the race reads the winner's."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return str(experiment.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=artifact_location))
    except MlflowException as error:
        experiment = client.get_experiment_by_name(name)
        if error.error_code != "RESOURCE_ALREADY_EXISTS" or experiment is None:
            raise
        return str(experiment.experiment_id)
