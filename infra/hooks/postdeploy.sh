#!/usr/bin/env bash
# azd postdeploy: the functions now exist, so Event Grid can validate subscriptions to them. On the first
# deploy, turn the subscriptions on (main.bicep's functionsPublished) and provision again; afterwards every
# provision keeps them, and this hook has nothing to do.
set -euo pipefail
if [ "${RETRAIN_FUNCTIONS_PUBLISHED:-false}" = "true" ]; then
  exit 0
fi
azd env set RETRAIN_FUNCTIONS_PUBLISHED true
azd provision --no-prompt
