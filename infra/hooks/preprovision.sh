#!/usr/bin/env bash
# azd preprovision, before every provision:
#
# 1. Name this incarnation. The key vault (purge protection on) and the Azure ML workspace stay soft-deleted
#    under their names after `azd down`; a purge-protected vault cannot be purged at all (not even by
#    `azd down --purge`) until its retention ends. So their names end in RETRAIN_NAME_SUFFIX (main.bicep's
#    nameSuffix), a few random lowercase letters set here once per incarnation and kept while it lives; the
#    postdown hook (infra/hooks/postdown.sh) clears it, and the next `azd up` gets fresh names while the old
#    ones sit soft-deleted. An environment provisioned before the suffix existed (it has RETRAIN_FUNCTION_APP,
#    an output of main.bicep, and no suffix) keeps its names, so its resources are not made twice.
# 2. Check that the region offers the GPU clusters' VM size (components/compute/gpu-*.yml) to this
#    subscription, with `az vm list-skus`: one clear line here rather than a compute failure deep in the
#    deployment. RETRAIN_SKIP_SKU_CHECK=true skips it.
#
# azd passes the environment's values (.azure/<env>/.env) to hooks as environment variables, and reloads them
# after the hook.
set -euo pipefail
cd "$(dirname "$0")/../.."

env_set() {
  if [ -n "${AZURE_ENV_NAME:-}" ]; then
    azd env set --environment "$AZURE_ENV_NAME" "$1" "$2"
  else
    azd env set "$1" "$2"
  fi
}

if [ -n "${RETRAIN_NAME_SUFFIX:-}" ]; then
  echo "preprovision: this incarnation's names end in '${RETRAIN_NAME_SUFFIX}' (RETRAIN_NAME_SUFFIX)"
elif [ -n "${RETRAIN_FUNCTION_APP:-}" ]; then
  echo "preprovision: ${RETRAIN_FUNCTION_APP} was provisioned without a name suffix; keeping its names" \
    "(after \`azd down --purge\` the next \`azd up\` gets one)"
else
  # tr stops on the closed pipe once head has its letters: that is expected, not a failure.
  suffix=$( (LC_ALL=C tr -dc 'a-z' </dev/urandom 2>/dev/null || true) | head -c 5)
  env_set RETRAIN_NAME_SUFFIX "$suffix"
  echo "preprovision: a new incarnation; its key vault and workspace names end in '${suffix}' (RETRAIN_NAME_SUFFIX)"
fi

gpu_size=$(sed -n 's/^size: *//p' components/compute/gpu-dedicated.yml)
if [ "${RETRAIN_SKIP_SKU_CHECK:-false}" = "true" ]; then
  echo "preprovision: not checking ${gpu_size} in the region (RETRAIN_SKIP_SKU_CHECK=true)"
elif [ -z "${AZURE_LOCATION:-}" ]; then
  echo "preprovision: no AZURE_LOCATION yet, so ${gpu_size} is not checked in the region"
else
  # Offered: listed for the region with no Location restriction (a Zone restriction still allows the size).
  offered=$(az vm list-skus --location "$AZURE_LOCATION" --size "$gpu_size" --resource-type virtualMachines \
    --query "[?name=='${gpu_size}' && length(restrictions[?type=='Location'])==\`0\`].name" --output tsv)
  if [ -z "$offered" ]; then
    echo "preprovision: ${gpu_size} (the GPU clusters' size, components/compute/gpu-*.yml) is not offered" \
      "to this subscription in ${AZURE_LOCATION}; choose a region that offers it (\`az vm list-skus" \
      "--location <region> --size Standard_NC --output table\`, then \`azd env set AZURE_LOCATION <region>\`)," \
      "or set RETRAIN_SKIP_SKU_CHECK=true to deploy without the check" >&2
    exit 1
  fi
  echo "preprovision: ${AZURE_LOCATION} offers ${gpu_size}"
fi
