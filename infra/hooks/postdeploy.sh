#!/usr/bin/env bash
# azd postdeploy, after every deploy of the code: the functions now exist, so Event Grid can validate
# subscriptions to them. Deploy infra/modules/subscriptions.bicep into the resource group with
# `az deployment group create`, from infra/main.bicep's outputs (azd passes them to hooks as environment
# variables). It is the same deployment every time (idempotent), so it also follows infra/event-routing.json.
# No hook provisions (azd's own hooks would loop), and no flag records that the code is published.
#
# Role assignments take a while to reach Event Grid (the topics dead-letter with their own identities, which
# roles.bicep has just granted), so a failed deployment is tried again: RETRAIN_SUBSCRIPTIONS_TRIES times
# (6), RETRAIN_SUBSCRIPTIONS_WAIT_SECONDS (20) apart, then the hook fails with one line.
set -euo pipefail
cd "$(dirname "$0")/../.."

template=infra/modules/subscriptions.bicep
tries=${RETRAIN_SUBSCRIPTIONS_TRIES:-6}
wait_seconds=${RETRAIN_SUBSCRIPTIONS_WAIT_SECONDS:-20}

for name in AZURE_RESOURCE_GROUP RETRAIN_FUNCTION_APP RETRAIN_STORAGE_ACCOUNT RETRAIN_DEAD_LETTER_CONTAINER \
  RETRAIN_STORAGE_TOPIC RETRAIN_WORKSPACE_TOPIC; do
  if [ -z "${!name:-}" ]; then
    echo "postdeploy: ${name} is not in the azd environment; run \`azd provision\` (infra/main.bicep's outputs set it)" >&2
    exit 1
  fi
done

try=1
until az deployment group create --name retrain-subscriptions --resource-group "$AZURE_RESOURCE_GROUP" \
  --template-file "$template" --only-show-errors --output none \
  --parameters \
  functionAppName="$RETRAIN_FUNCTION_APP" \
  storageAccountName="$RETRAIN_STORAGE_ACCOUNT" \
  deadLetterContainer="$RETRAIN_DEAD_LETTER_CONTAINER" \
  storageTopicName="$RETRAIN_STORAGE_TOPIC" \
  workspaceTopicName="$RETRAIN_WORKSPACE_TOPIC" \
  deployDriftTopic="${RETRAIN_DRIFT_TOPIC_DEPLOYED:-false}" \
  driftTopicName="${RETRAIN_DRIFT_TOPIC_NAME:-}"; do
  if [ "$try" -ge "$tries" ]; then
    echo "postdeploy: ${template} failed ${tries} times (az's errors above); fix them and run \`azd deploy\` again" >&2
    exit 1
  fi
  echo "postdeploy: ${template} failed (try ${try} of ${tries}; role assignments may still be reaching" \
    "Event Grid); trying again in ${wait_seconds} s" >&2
  sleep "$wait_seconds"
  try=$((try + 1))
done
echo "postdeploy: the Event Grid subscriptions to ${RETRAIN_FUNCTION_APP} are deployed (${template})"
