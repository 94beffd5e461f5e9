"""The app settings a test's front door starts from: the corpus's landing blobs, a local ledger, dry-run
submissions and no waiting."""

from __future__ import annotations

from pathlib import Path

from helpers.function_app.corpus import ACCOUNT, CONTAINER, MAX_BODY_BYTES, MODEL, PREFIX


def app_settings(home: Path, **overrides: str) -> dict[str, str]:
    """App settings for a front door in `home`: dry-run submissions, the corpus's landing blobs, a local
    ledger, and no waiting (quiet period, maximum wait and cooldown 0) unless `overrides` say otherwise."""
    settings = {
        "RETRAIN_SUBMITTER": "dry-run",
        "RETRAIN_HOME": str(home),
        "RETRAIN_MODEL_NAME": MODEL,
        "RETRAIN_BLOB_ACCOUNT": ACCOUNT,
        "RETRAIN_BLOB_CONTAINER": CONTAINER,
        "RETRAIN_BLOB_PREFIX": f"{PREFIX}/",
        "RETRAIN_LEDGER": str(home / "ledger"),
        "RETRAIN_DEBOUNCE_QUIET_SECONDS": "0",
        "RETRAIN_DEBOUNCE_MAX_WAIT_SECONDS": "0",
        "RETRAIN_COOLDOWN_SECONDS": "0",
        "RETRAIN_MAX_RUNS_PER_DAY": "6",
        "RETRAIN_HTTP_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    return {**settings, **overrides}
