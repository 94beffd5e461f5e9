"""`retrain train --checkpoints URL`: a secret pasted into the URL (user info, a SAS signature, an account
key), made up here and holding '/', '+', '=' and '%2F', appears in none of the CLI's output at debug level."""

from __future__ import annotations

import os
import secrets
import sys

CLI = (sys.executable, "-m", "retrain_cli", "--verbose", "train", "--no-mlflow")
ENDPOINT = "https://retraindata.blob.core.windows.net"


def test_a_checkpoints_url_shows_no_secret_in_any_output(tmp_path, prepared_data, warm_starts):
    pieces = [secrets.token_urlsafe(9) for _ in range(4)]
    secret = f"{pieces[0]}/{pieces[1]}+{pieces[2]}%2F{pieces[3]}="
    urls = {
        "user info": f"https://user:{secret}@retraindata.blob.core.windows.net/checkpoints/run",
        "SAS": f"{ENDPOINT}/checkpoints/run?sv=2024-08-04&sp=racwl&sig={secret}",
        "account key": f"{ENDPOINT}/checkpoints/run#AccountKey={secret}",
        "another scheme": f"abfss://user:{secret}@retraindata.dfs.core.windows.net/checkpoints",
    }
    # Each run is a process of its own (forked warm): the placements that take different paths (the blob
    # URL parser, the trainer's SAS refusal, the store's unsupported scheme), not every one;
    # tests/function_app/test_secrets.py covers every placement in the shared parser.
    environ = {key: value for key, value in os.environ.items() if not key.startswith("RETRAIN_")}
    for where, url in urls.items():
        argv = [*CLI, "--data", str(prepared_data), "--out", str(tmp_path / "out"), "--checkpoints", url]
        result = warm_starts.run(argv, environ)
        output = result.stdout + result.stderr

        assert result.returncode == 2, f"{where}: {output}"
        assert "--checkpoints" in output or "checkpoint store" in output, f"{where}: {output}"
        leaked = [secret[i : i + 8] for i in range(len(secret) - 7) if secret[i : i + 8] in output]
        assert leaked == [], f"{where}: {output}"
