"""Will the train step ever get its nodes? A check of the workspace's vCPU quota before submitting.

Azure ML reports quota per region as rows such as 'Standard NCADSA100v4 Family Cluster Dedicated vCPUs'
(per VM family, dedicated tier) and 'Total Cluster Dedicated Regional vCPUs' / 'Total Cluster LowPriority
Regional vCPUs' (all families; low-priority quota is one regional pool, its per-family rows say -1). The
VM sizes list maps the compute's size to its family ('standardNCADSA100v4Family') and vCPUs per node.

A run that needs more vCPUs than a limit can never start: it would sit queued forever, so it is refused
with a message naming the family, the need and the limit. A run that fits the limit but not what is free
right now only waits for other jobs to finish; that is logged, not refused.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from components.azureml.workspace import ComputeRecord, UsageRecord, VmSizeRecord
from components.errors import SubmissionError

log = logging.getLogger(__name__)

_NOT_ALNUM = re.compile(r"[^a-z0-9]")


def _key(text: str) -> str:
    return _NOT_ALNUM.sub("", text.lower())


@dataclass(frozen=True)
class QuotaCheck:
    """What the train step needs, and the quota rows that bound it."""

    family: str
    vcpus_needed: int
    rows: tuple[UsageRecord, ...]

    @property
    def must_wait(self) -> bool:
        return any(0 <= row.limit < row.current + self.vcpus_needed for row in self.rows)


def quota_rows(family: str, low_priority: bool, usages: Sequence[UsageRecord]) -> tuple[UsageRecord, ...]:
    """The rows that bound a node of `family` on the given tier: its family row(s) and the regional total."""
    tier = "lowpriority" if low_priority else "dedicated"
    wanted = {f"{_key(family)}cluster{tier}vcpus", f"totalcluster{tier}regionalvcpus"}
    return tuple(usage for usage in usages if _key(usage.name) in wanted)


def _size_of(compute: ComputeRecord, sizes: Sequence[VmSizeRecord]) -> VmSizeRecord:
    for size in sizes:
        if size.name.lower() == compute.size.lower():
            return size
    raise SubmissionError(
        f"compute {compute.name}: VM size {compute.size!r} is not offered in "
        f"{compute.location or 'its region'}; expected a size listed by `az ml compute list-sizes`"
    )


def check_quota(
    compute: ComputeRecord,
    sizes: Sequence[VmSizeRecord],
    usages: Sequence[UsageRecord],
    instance_count: int,
    processes_per_instance: int,
) -> QuotaCheck:
    """Refuse a train step that can never be scheduled on `compute`; return what bounds it otherwise."""
    if instance_count > compute.max_instances:
        raise SubmissionError(
            f"--nodes {instance_count}: compute {compute.name} scales to at most {compute.max_instances} "
            "nodes; use fewer nodes or raise its max_instances"
        )
    size = _size_of(compute, sizes)
    if size.gpus and processes_per_instance > size.gpus:
        raise SubmissionError(
            f"--gpus {processes_per_instance}: a {size.name} node of compute {compute.name} has {size.gpus} "
            "GPUs; expected at most that many processes per node"
        )
    need = instance_count * size.vcpus
    tier = "low-priority" if compute.low_priority else "dedicated"
    rows = quota_rows(size.family, compute.low_priority, usages)
    if not any(_key(size.family) in _key(row.name) for row in rows):
        log.warning("no %s quota row for VM family %s; checking the regional total only", tier, size.family)
    for row in rows:
        if 0 <= row.limit < need:
            raise SubmissionError(
                f"quota: the train step needs {need} {tier} vCPUs ({instance_count} nodes x {size.vcpus} "
                f"vCPUs of {size.name}, family {size.family}) but '{row.name}' allows {row.limit}; request "
                "a quota increase or use fewer nodes"
            )
    check = QuotaCheck(family=size.family, vcpus_needed=need, rows=rows)
    if check.must_wait:
        log.warning(
            "quota: %d %s vCPUs of family %s are needed and not all are free now; the job will queue",
            need,
            tier,
            size.family,
        )
    return check
