// A new Azure ML workspace with the resources it needs: its own storage account (the workspace's default
// datastores, code snapshots and job outputs; Azure ML manages it, so it is kept apart from the data account,
// which admits no shared keys) and its own key vault; telemetry goes to the deployment's Application Insights.
// Deployed only when no existing workspace is named (main.bicep's existingWorkspaceName).

param name string
param location string
param tags object = {}
param storageAccountName string
param keyVaultName string
param applicationInsightsId string

resource storage 'Microsoft.Storage/storageAccounts@2026-09-01' = {
  // checkov:skip=CKV_AZURE_206: locally redundant: the workspace's storage holds re-creatable snapshots and job outputs
  // checkov:skip=CKV_AZURE_59: Azure ML compute and studio reach the workspace storage over its public endpoint (no managed virtual network here)
  // checkov:skip=CKV_AZURE_43: the name is 'stml' + uniqueString(...) (main.bicep): 17 lowercase letters and digits, within the rules; checkov judges the unresolved interpolation
  // checkov:skip=CKV_AZURE_35: without a managed virtual network, Azure ML compute and studio reach the workspace storage through its public endpoint, so the network default cannot be deny
  name: storageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
  }
}

resource keyVault 'Microsoft.KeyVault/vaults@2026-05-15' = {
  // checkov:skip=CKV_AZURE_109: Azure ML reaches its key vault over the public endpoint (no managed virtual network here); access is by Azure RBAC only
  // checkov:skip=CKV_AZURE_189: as above, public network access is how Azure ML reaches the vault without a managed virtual network
  name: keyVaultName
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 7
    enablePurgeProtection: true
  }
}

resource workspace 'Microsoft.MachineLearningServices/workspaces@2025-12-01' = {
  // checkov:skip=CKV_AZURE_243: no private endpoint: the Function App (Flex Consumption without a virtual network) reaches the workspace over its public endpoint, with Microsoft Entra ID
  name: name
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    friendlyName: name
    storageAccount: storage.id
    keyVault: keyVault.id
    applicationInsights: applicationInsightsId
    publicNetworkAccess: 'Enabled'
  }
}

// The workspace's identity reads and writes its key vault's secrets (datastore and connection credentials).
// The vault uses the RBAC permission model, so an access policy grants nothing: Microsoft's identity page for
// Azure ML lists Key Vault Administrator on the workspace's key vault as required with that model
// (https://learn.microsoft.com/azure/machine-learning/how-to-identity-based-service-authentication).
// This module deploys only for a new workspace; an existing one keeps the roles it was given.
var roles = loadJsonContent('../roles.json')
var keyVaultAdministrator = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Key Vault Administrator'])

resource workspaceKeyVault 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: keyVault
  name: guid(keyVault.id, workspace.id, keyVaultAdministrator)
  properties: {
    roleDefinitionId: keyVaultAdministrator
    principalId: workspace.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

output name string = workspace.name
output id string = workspace.id
output storageAccountName string = storage.name
