#!/usr/bin/env bash
# azd postprovision: register the training environment and the components in the workspace the deployment
# made (`retrain publish`), so that the first upload submits a job whose references all resolve. azd passes
# the deployment's outputs as environment variables: AZURE_SUBSCRIPTION_ID, AZURE_RESOURCE_GROUP and
# AZUREML_WORKSPACE are the settings `retrain publish` reads. It runs in the project's virtual environment
# (`make .venv/.installed`, as the README's local setup does) with the deployer's azd/az sign-in.
set -euo pipefail
cd "$(dirname "$0")/../.."
make --quiet .venv/.installed
.venv/bin/retrain publish
