"""Fixtures for the local runner's tests: raw data, run requests, and a small pipeline of quick steps
(tests/helpers/components/quick_pipeline.py). The real pipeline (components/pipeline.yml) is run by
local/test_local_pipeline.py with a small training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.components.quick_pipeline import QuickPipeline, QuickRequest, write_quick_pipeline
from helpers.components.run_requests import pinned_request

from components.request import RunRequest


@pytest.fixture(scope="session")
def sample_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits sample as 4 raw CSV batches (read-only for tests: copy it to change it)."""
    from training.tasks.tabular.sample_data import write_sample_batches

    raw = tmp_path_factory.mktemp("sample-raw") / "raw"
    write_sample_batches(raw, batches=4)
    return raw


@pytest.fixture
def quick_pipeline(tmp_path: Path) -> QuickPipeline:
    return write_quick_pipeline(tmp_path / "quick")


@pytest.fixture
def quick_request(tmp_path: Path, quick_pipeline: QuickPipeline) -> QuickRequest:
    """Pin the quick pipeline's raw numbers (or another folder) under the test's state folder."""

    def make(raw: Path | None = None, **request_fields: Any) -> RunRequest:
        return pinned_request(
            tmp_path / "state", raw or quick_pipeline.raw, model_name="quick", **request_fields
        )

    return make
