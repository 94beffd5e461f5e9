// The deployment's storage account: the landing data, the front door's ledger, the checkpoints (also the
// Azure ML datastore for snapshots and the registry lock), Event Grid's dead letters, the Function App's
// deployment package and the Functions host's own containers. Every client uses Microsoft Entra ID (managed
// identities), so shared key access is off; the host's containers are created here because its identity is
// granted roles on those containers only, which do not include creating containers.

@description('Storage account name (3-24 lowercase letters and digits).')
param name string
param location string
param tags object = {}
@description('The containers: landing, ledger, checkpoints, deadLetter, deployment.')
param containers object

// The Functions host keeps its keys and its timer/singleton leases in these two containers.
var hostContainers = ['azure-webjobs-hosts', 'azure-webjobs-secrets']
// One line: checkov's own (older) Bicep parser cannot read a call whose arguments start on a new line.
var dataContainers = [containers.landing, containers.ledger, containers.checkpoints, containers.deadLetter, containers.deployment]
var allContainers = concat(dataContainers, hostContainers)

resource account 'Microsoft.Storage/storageAccounts@2026-09-01' = {
  // checkov:skip=CKV_AZURE_206: locally redundant storage is enough for data that is re-uploadable and checkpoints that are rewritten; a geo-replicated account is a parameterless change (sku) for those who need it
  // checkov:skip=CKV_AZURE_35: Flex Consumption without a virtual network and Azure ML compute clusters (not trusted services) reach the account over its public endpoint, so the network default cannot be deny; only Entra ID identities with a data role get in
  // checkov:skip=CKV_AZURE_59: Event Grid, Flex Consumption and Azure ML compute reach the account over the public endpoint; the account admits Entra ID only (no shared keys, no anonymous blobs)
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowCrossTenantReplication: false
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2026-09-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource blobContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' = [for container in allContainers: {
  parent: blobService
  name: container
  properties: {
    publicAccess: 'None'
  }
}]

output name string = account.name
output id string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
