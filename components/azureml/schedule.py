"""A cron schedule for the same pipeline, for data that arrives steadily rather than in events.

Each firing is its own job with a name Azure ML generates, so its checkpoints go under that name
(`${{name}}`); the data input names a moving target (`azureml:<asset>@latest` or a datastore folder), which
is the point of a schedule. The schedule is built and validated locally, then created through the seam.

A dry run writes it as the YAML that `az ml schedule create -f` (azure-ai-ml's `load_schedule`) reads. That
schema takes the job only by reference (`create_job.job`: a job YAML file, or an existing job's ARM id), never
inline, so the pipeline job goes to a file of its own, which the schedule's YAML names.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.azureml.builder import CHECKPOINTS_ROOT, PipelineBuild, build_pipeline_job, validate_job
from components.azureml.names import RESOURCE_NAME_FORM, is_resource_name
from components.errors import SubmissionError
from core.files import write_atomically

if TYPE_CHECKING:
    from azure.ai.ml.entities import JobSchedule

    from components.azureml.workspace import AssetRecord, AzureMLWorkspace

SCHEDULE_SCHEMA = "https://azuremlschemas.azureedge.net/latest/schedule.schema.json"
SCHEDULED_JOB_FILE = "pipeline.yml"
# minute, hour, day of month, month, day of week: the five fields Azure ML's CronTrigger reads.
_CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 6),
)
_CRON_ITEM = re.compile(r"(?P<range>\*|\d+(?:-\d+)?)(?:/(?P<step>\d+))?")


def _cron_item_ok(item: str, low: int, high: int) -> bool:
    match = _CRON_ITEM.fullmatch(item)
    if not match:
        return False
    if match["step"] is not None and int(match["step"]) < 1:
        return False
    if match["range"] == "*":
        return True
    bounds = [int(number) for number in match["range"].split("-")]
    return all(low <= number <= high for number in bounds) and bounds == sorted(bounds)


def check_cron(expression: str) -> str:
    """The expression, normalized to single spaces; a one-line error when it is not a 5-field cron."""
    fields = expression.split()
    expected = "expected 5 fields 'minute hour day-of-month month day-of-week', e.g. '0 3 * * *'"
    if len(fields) != len(_CRON_FIELDS):
        raise SubmissionError(f"--cron {expression!r}: {len(fields)} fields; {expected}")
    for text, (label, low, high) in zip(fields, _CRON_FIELDS, strict=True):
        if not all(_cron_item_ok(item, low, high) for item in text.split(",")):
            raise SubmissionError(
                f"--cron {expression!r}: {label} {text!r} is not *, a number {low}-{high}, a range a-b, "
                f"a step */n or a list of those; {expected}"
            )
    return " ".join(fields)


def check_time_zone(time_zone: str) -> str:
    from azure.ai.ml.constants import TimeZone

    known = {zone.value for zone in TimeZone}
    if time_zone not in known:
        raise SubmissionError(
            f"--time-zone {time_zone!r}: expected a Windows time zone name such as 'UTC', "
            "'W. Europe Standard Time' or 'Pacific Standard Time'"
        )
    return time_zone


def scheduled_checkpoints_path(datastore: str, model_name: str) -> str:
    """Per firing: `${{name}}` is the job name Azure ML gives each scheduled job."""
    return f"azureml://datastores/{datastore}/paths/{CHECKPOINTS_ROOT}/{model_name}-scheduled/${{{{name}}}}/"


def build_schedule(name: str, cron: str, time_zone: str, build: PipelineBuild) -> JobSchedule:
    """A JobSchedule that creates the pipeline job of `build` (without a fixed job name) on `cron`."""
    from azure.ai.ml.entities import CronTrigger, JobSchedule

    if not is_resource_name(name):
        raise SubmissionError(f"--name {name!r}: expected {RESOURCE_NAME_FORM} for a schedule name")
    expression, zone = check_cron(cron), check_time_zone(time_zone)
    job = build_pipeline_job(replace(build, job_name=None))
    schedule = JobSchedule(
        name=name,
        display_name=f"retrain {build.model_name} on '{expression}' ({zone})",
        trigger=CronTrigger(expression=expression, time_zone=zone),
        create_job=job,
        tags={"retrain.model_name": build.model_name, "retrain.schedule": expression},
    )
    validate_job(schedule)
    return schedule


def create_schedule(workspace: AzureMLWorkspace, schedule: JobSchedule) -> AssetRecord:
    return workspace.create_schedule(schedule)


def write_schedule_files(schedule: JobSchedule, folder: Path) -> dict[str, Any]:
    """Write the schedule's pipeline job to `folder`/pipeline.yml; return the schedule's YAML mapping, which
    names that file (by its absolute path, so the schedule's YAML loads from wherever it is saved)."""
    job_file = Path(folder).resolve() / SCHEDULED_JOB_FILE
    job = yaml.safe_dump(schedule.create_job._to_dict(), sort_keys=False)
    write_atomically(job_file, job.encode())
    document = {key: value for key, value in schedule._to_dict().items() if key != "create_job"}
    return {"$schema": SCHEDULE_SCHEMA, **document, "create_job": {"type": "pipeline", "job": str(job_file)}}
