"""The quota check (pure): the VM family's and the region's vCPU limits against what the train step needs."""

from __future__ import annotations

import logging

import pytest
from helpers.components.azure_fakes import A100_FAMILY, standard_computes, standard_sizes, standard_usages

from components.azureml.quota import check_quota, quota_rows
from components.azureml.workspace import UsageRecord
from components.errors import SubmissionError

COMPUTES = standard_computes()


def test_a_fitting_request_passes_and_reports_its_bounds():
    check = check_quota(COMPUTES["gpu-dedicated"], standard_sizes(), standard_usages(), 2, 1)
    assert (check.family, check.vcpus_needed) == (A100_FAMILY, 48)
    assert [row.name for row in check.rows] == [
        "Total Cluster Dedicated Regional vCPUs",
        "Standard NCADSA100v4 Family Cluster Dedicated vCPUs",
    ]
    assert not check.must_wait


def test_low_priority_is_bounded_by_the_regional_low_priority_pool():
    rows = quota_rows(A100_FAMILY, low_priority=True, usages=standard_usages())
    assert [(row.name, row.limit) for row in rows] == [
        ("Total Cluster LowPriority Regional vCPUs", 96),
        ("Standard NCADSA100v4 Family Cluster LowPriority vCPUs", -1),  # -1: no per-family limit
    ]
    assert check_quota(COMPUTES["gpu-spot"], standard_sizes(), standard_usages(), 4, 1).vcpus_needed == 96


def test_more_than_the_family_limit_is_refused_naming_family_need_and_limit():
    usages = [
        UsageRecord("Standard NCADSA100v4 Family Cluster Dedicated vCPUs", "vmFamily", 0, 24),
        UsageRecord("Total Cluster Dedicated Regional vCPUs", "dedicatedCores", 0, 500),
    ]
    with pytest.raises(SubmissionError) as raised:
        check_quota(COMPUTES["gpu-dedicated"], standard_sizes(), usages, 2, 1)
    assert str(raised.value) == (
        "quota: the train step needs 48 dedicated vCPUs (2 nodes x 24 vCPUs of Standard_NC24ads_A100_v4, "
        f"family {A100_FAMILY}) but 'Standard NCADSA100v4 Family Cluster Dedicated vCPUs' allows 24; "
        "request a quota increase or use fewer nodes"
    )


def test_the_regional_total_binds_too():
    usages = [UsageRecord("Total Cluster LowPriority Regional vCPUs", "lowPriorityCores", 0, 0)]
    with pytest.raises(
        SubmissionError, match=r"needs 24 low-priority vCPUs .* 'Total Cluster LowPriority .* allows 0"
    ):
        check_quota(COMPUTES["gpu-spot"], standard_sizes(), usages, 1, 1)


def test_a_fit_that_must_wait_for_free_vcpus_is_logged_not_refused(caplog):
    usages = [UsageRecord("Standard NCADSA100v4 Family Cluster Dedicated vCPUs", "vmFamily", 40, 48)]
    with caplog.at_level(logging.WARNING):
        check = check_quota(COMPUTES["gpu-dedicated"], standard_sizes(), usages, 1, 1)
    assert check.must_wait
    assert "the job will queue" in caplog.text


def test_a_missing_family_row_is_logged_and_the_total_still_checked(caplog):
    usages = [UsageRecord("Total Cluster Dedicated Regional vCPUs", "dedicatedCores", 0, 100)]
    with caplog.at_level(logging.WARNING):
        check_quota(COMPUTES["gpu-dedicated"], standard_sizes(), usages, 1, 1)
    assert f"no dedicated quota row for VM family {A100_FAMILY}" in caplog.text


def test_more_nodes_than_the_cluster_scales_to_is_refused():
    with pytest.raises(SubmissionError, match=r"--nodes 3: compute gpu-dedicated scales to at most 2 nodes"):
        check_quota(COMPUTES["gpu-dedicated"], standard_sizes(), standard_usages(), 3, 1)


def test_more_processes_than_gpus_per_node_is_refused():
    with pytest.raises(SubmissionError, match=r"--gpus 4: a Standard_NC24ads_A100_v4 node .* has 1 GPUs"):
        check_quota(COMPUTES["gpu-spot"], standard_sizes(), standard_usages(), 1, 4)


def test_a_size_not_offered_in_the_region_is_refused():
    with pytest.raises(
        SubmissionError, match=r"VM size 'Standard_NC24ads_A100_v4' is not offered in westeurope"
    ):
        check_quota(COMPUTES["gpu-spot"], standard_sizes()[2:], standard_usages(), 1, 1)
