#!/usr/bin/env bash
# azd postdown, after `azd down` removed the resource group: clear what this environment kept about the
# incarnation that is gone, so the next `azd up` in it starts clean:
#   RETRAIN_NAME_SUFFIX          the names' suffix; preprovision sets a new one, so the new key vault and
#                                workspace do not collide with the old ones, which stay soft-deleted (a
#                                purge-protected key vault cannot be purged, even by `azd down --purge`)
#   RETRAIN_FUNCTION_APP         main.bicep's output, which preprovision reads as "an incarnation is live"
#   RETRAIN_FUNCTIONS_PUBLISHED  the flag earlier versions of postdeploy.sh set (nothing reads it now)
# azd has no `azd env unset`: a value set to "" is how it clears one, and every reader here takes "" as unset.
set -euo pipefail

env_set() {
  if [ -n "${AZURE_ENV_NAME:-}" ]; then
    azd env set --environment "$AZURE_ENV_NAME" "$1" "$2"
  else
    azd env set "$1" "$2"
  fi
}

for name in RETRAIN_NAME_SUFFIX RETRAIN_FUNCTION_APP RETRAIN_FUNCTIONS_PUBLISHED; do
  env_set "$name" ""
done
echo "postdown: cleared RETRAIN_NAME_SUFFIX, RETRAIN_FUNCTION_APP and RETRAIN_FUNCTIONS_PUBLISHED; the next" \
  "\`azd up\` names a new incarnation"
