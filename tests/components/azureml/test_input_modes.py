"""Each step reads the pinned raw data downloaded when it fits its node's disk comfortably, mounted read-only
otherwise: checked on the job azure-ai-ml builds and would send (its REST body), offline."""

from __future__ import annotations

import pytest

from components.azureml.builder import PipelineBuild, build_pipeline_job
from components.azureml.input_modes import DISK_TAG, compute_disks
from components.errors import SpecError, SubmissionError
from components.request import DataRef, RunRequest
from components.specs import COMPUTE_DIR

VERSION = "rd-0123456789abcdef"
ASSET = f"azureml:digits-raw:{VERSION}"
GIB = 1 << 30


def _prep_input(size_bytes: int | None, **request) -> dict:
    """The prep step's raw_data input as the job's REST body carries it (the built node says the same)."""
    job = build_pipeline_job(
        PipelineBuild.for_request(RunRequest("digits", DataRef(VERSION, ASSET, size_bytes), **request))
    )
    assert job._validate().passed
    sent = job._to_rest_object().as_dict()["properties"]["jobs"]["prep"]["inputs"]["raw_data"]
    assert job.jobs["prep"].inputs.raw_data.mode == _MODES[sent.get("mode")]
    return sent


_MODES = {"Download": "download", "ReadOnlyMount": "ro_mount", None: None}


def test_the_compute_yamls_say_their_nodes_disk():
    # cpu-cluster (prep's): Standard_D4s_v5, no temporary disk; the GPU clusters' 64 GiB temporary disk.
    assert dict(compute_disks()) == {"cpu-cluster": 30 * GIB, "gpu-spot": 64 * GIB, "gpu-dedicated": 64 * GIB}


def test_small_data_is_downloaded_and_huge_data_mounted_read_only():
    small = _prep_input(2 * 2**20)
    huge = _prep_input(100 * GIB)

    assert small == {"value": "${{parent.inputs.raw_data}}", "job_input_type": "literal", "mode": "Download"}
    assert huge["mode"] == "ReadOnlyMount"


def test_download_is_chosen_up_to_half_the_disk_of_the_step_s_own_compute():
    # prep runs on cpu-cluster (30 GiB): up to 15 GiB is downloaded.
    assert _prep_input(15 * GIB)["mode"] == "Download"
    assert _prep_input(15 * GIB + 1)["mode"] == "ReadOnlyMount"
    # The same data, with prep sent to a compute of a bigger disk, fits there.
    assert _prep_input(20 * GIB, compute={"prep": "gpu-spot"})["mode"] == "Download"


def test_an_unknown_size_or_disk_leaves_azure_ml_s_default():
    assert "mode" not in _prep_input(None)  # a data asset named by a request: its size is not at hand
    assert "mode" not in _prep_input(2**20, compute={"prep": "cpu-big"})  # no YAML says its disk


def test_a_bad_disk_tag_or_size_is_one_line_naming_it(tmp_path):
    (tmp_path / "cpu.yml").write_text(
        (COMPUTE_DIR / "cpu-cluster.yml").read_text().replace(f'{DISK_TAG}: "30"', f'{DISK_TAG}: "30 GiB"')
    )
    with pytest.raises(SpecError, match=rf"cpu\.yml: tags\.{DISK_TAG} '30 GiB'; expected the GiB") as raised:
        compute_disks(tmp_path)
    assert "\n" not in str(raised.value)
    with pytest.raises(SubmissionError, match=r"^data size -1: expected the pinned files' bytes"):
        DataRef(VERSION, ASSET, -1)
