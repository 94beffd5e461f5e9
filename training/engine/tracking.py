"""Experiment tracking behind a small protocol: MLflow when configured, nothing otherwise.

Only rank 0 tracks. Step metrics are buffered and sent in batches, asynchronously, so a slow tracking
store never stalls training; a resumed run continues the same MLflow run (its id travels in the
checkpoint), so one logical training has one run however often it was evicted.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from core.secrets import mask_secrets, mask_secrets_in
from training.mlflow_names import keyed, record_renamed

log = logging.getLogger(__name__)

V = TypeVar("V")


class Tracker(Protocol):
    def start(self, run_id: str | None, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        """Start (or continue, given `run_id`) a tracked run; returns its id."""
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def finish(self, status: str) -> None:
        """Flush everything; `status` is FINISHED, FAILED or KILLED (preempted, to be resumed)."""
        ...


# MLflow refuses (and would fail the run on) a longer parameter value; a task's options can be long.
MAX_PARAM_LENGTH = 6000


def param_text(value: Any) -> str:
    """A parameter as MLflow stores it: text, JSON for options and lists, masked, cut to what MLflow
    accepts."""
    text = mask_secrets(json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value))
    return text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 3] + "..."


class NullTracker:
    def start(self, run_id: str | None, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        return run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def finish(self, status: str) -> None:
        pass


class MlflowTracker:
    """Logs to an MLflow tracking store (local SQLite by default, the workspace's in Azure ML)."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        artifact_location: str | None = None,
        flush_every_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        job_run_id: str | None = None,
    ) -> None:
        from training.mlflow_setup import mlflow_client

        # Azure ML gives each job its own MLflow run (MLFLOW_RUN_ID). A first attempt trains in it; a resumed
        # attempt (a resubmitted job) continues the checkpointed run, and still tags its own job's run, which
        # is where the pipeline's submitter looks for preemptions.
        self._job_run_id = job_run_id
        self._client = mlflow_client(tracking_uri)
        self._experiment = experiment
        self._artifact_location = artifact_location
        self._flush_every = flush_every_seconds
        self._clock = clock
        self._last_flush = clock()
        self._pending: list[Any] = []
        self._run_id: str | None = None
        self._renamed: dict[str, str] = {}  # {MLflow key: name} of what this tracker logged
        self._recorded: set[str] = set()  # the keys already in the run's names artifact

    def start(self, run_id: str | None, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        from mlflow.entities import Param, RunTag

        run_tags = self._keyed(mask_secrets_in(tags))  # a tag may quote a location (a trigger's URL)
        if run_id is None:
            if self._job_run_id is None:
                self._run_id = self._client.create_run(self._experiment_id(), tags=run_tags).info.run_id
            else:
                self._run_id = self._job_run_id
                self._client.log_batch(
                    self._run_id, tags=[RunTag(key, value) for key, value in run_tags.items()]
                )
            logged = self._keyed({key: param_text(value) for key, value in params.items()})
            self._client.log_batch(self._run_id, params=[Param(key, logged[key]) for key in sorted(logged)])
        else:
            self._run_id = run_id
            self._client.update_run(run_id, status="RUNNING")
            self._client.log_batch(run_id, tags=[RunTag(key, value) for key, value in run_tags.items()])
        return self._run_id  # what it renamed is recorded at the first flush: the run's id is kept first

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        logged = self._keyed(metrics)
        self._pending += [Metric(key, float(value), timestamp, step) for key, value in logged.items()]
        if self._clock() - self._last_flush >= self._flush_every:
            self._flush(synchronous=False)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        run_tags = [RunTag(key, value) for key, value in self._keyed(mask_secrets_in(tags)).items()]
        self._client.log_batch(self._require_run(), tags=run_tags)
        if self._job_run_id not in (None, self._run_id):
            self._client.log_batch(self._job_run_id, tags=run_tags)

    def finish(self, status: str) -> None:
        try:
            self._flush(synchronous=True)
        finally:  # a run whose last metrics could not be sent still ends, with the status it earned
            self._client.set_terminated(self._require_run(), status=status)

    def _flush(self, synchronous: bool) -> None:
        self._last_flush = self._clock()
        pending, self._pending = self._pending, []
        # MLflow accepts at most 1000 metrics per batch.
        for start in range(0, len(pending), 1000):
            self._client.log_batch(
                self._require_run(), metrics=pending[start : start + 1000], synchronous=synchronous
            )
        self._record_names()

    def _keyed(self, entries: Mapping[str, V]) -> dict[str, V]:
        """`entries` under MLflow keys; the keys that differ from their names are recorded on the run."""
        mapped, renamed = keyed(entries)
        self._renamed.update(renamed)
        return mapped

    def _record_names(self) -> None:
        """Add what this tracker renamed since the last time to the run's names artifact."""
        if self._run_id is None or self._renamed.keys() <= self._recorded:
            return
        record_renamed(self._client, self._run_id, self._renamed)
        self._recorded |= self._renamed.keys()

    def _experiment_id(self) -> str:
        from training.mlflow_setup import experiment_id

        return experiment_id(self._client, self._experiment, self._artifact_location)

    def _require_run(self) -> str:
        if self._run_id is None:
            raise RuntimeError("MlflowTracker.start() must be called before logging")
        return self._run_id


class TolerantTracker:
    """Keeps a tracking outage from killing a training run: failures are logged, training goes on."""

    def __init__(self, inner: Tracker) -> None:
        self._inner = inner
        self._failures = 0

    def start(self, run_id: str | None, params: Mapping[str, Any], tags: Mapping[str, str]) -> str | None:
        return self._call("start", run_id, params, tags, default=run_id)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._call("log_metrics", metrics, step, default=None)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._call("set_tags", tags, default=None)

    def finish(self, status: str) -> None:
        self._call("finish", status, default=None)

    def _call(self, method: str, *args: Any, default: Any) -> Any:
        try:
            return getattr(self._inner, method)(*args)
        except Exception as error:  # tracking is best effort; the checkpoint is the source of truth
            self._failures += 1
            level = logging.WARNING if self._failures <= 3 else logging.DEBUG
            log.log(
                level,
                "experiment tracking failed in %s (%d failures so far): %s",
                method,
                self._failures,
                mask_secrets(str(error)),
            )
            return default


def make_tracker(
    tracking_uri: str | None,
    experiment: str,
    artifact_location: str | None,
    is_primary: bool,
    job_run_id: str | None = None,
) -> Tracker:
    if not is_primary or not tracking_uri:
        return NullTracker()
    log.info("tracking to MLflow experiment %r", experiment)
    return TolerantTracker(MlflowTracker(tracking_uri, experiment, artifact_location, job_run_id=job_run_id))
