// What Retrain needs in an Azure ML workspace (new or existing): the compute clusters of
// components/compute/*.yml and two identity-based datastores: the pipeline's, on the deployment's checkpoints
// container, for checkpoints and the registry lock (RETRAIN_AZUREML_DATASTORE); and the data datastore, on the
// landing container, where pinned snapshots are registered as data assets (RETRAIN_AZUREML_DATA_DATASTORE: a
// snapshot is copied beside the landed blobs, and a data asset's path is relative to its datastore).
//
// The clusters are the YAMLs' exactly (tests/infra/ holds them equal: size, tier, min/max, idle time,
// identity), so that `retrain publish --computes` and this template never disagree. Each cluster has a
// system-assigned identity, as its YAML says: the training code authenticates with DefaultAzureCredential,
// which finds a cluster's system-assigned identity with no client id to configure, and the roles it needs are
// granted in this same deployment from the cluster's principalId (roles.bicep), so a user-assigned identity
// would buy nothing but one more resource to keep in step with the YAMLs.

param workspaceName string
param location string
param tags object = {}
param storageAccountName string
param checkpointsContainer string
param landingContainer string
param checkpointsDatastoreName string
param landingDatastoreName string

// One entry per components/compute/<name>.yml: tier low_priority -> LowPriority, dedicated -> Dedicated.
var clusters = [
  {
    name: 'cpu-cluster'
    vmSize: 'Standard_D4s_v5'
    vmPriority: 'Dedicated'
    minNodeCount: 0
    maxNodeCount: 4
    idleSeconds: 300
    identity: 'SystemAssigned'
  }
  {
    name: 'gpu-dedicated'
    vmSize: 'Standard_NC24ads_A100_v4'
    vmPriority: 'Dedicated'
    minNodeCount: 0
    maxNodeCount: 2
    idleSeconds: 120
    identity: 'SystemAssigned'
  }
  {
    name: 'gpu-spot'
    vmSize: 'Standard_NC24ads_A100_v4'
    vmPriority: 'LowPriority'
    minNodeCount: 0
    maxNodeCount: 4
    idleSeconds: 120
    identity: 'SystemAssigned'
  }
]

resource workspace 'Microsoft.MachineLearningServices/workspaces@2025-12-01' existing = {
  name: workspaceName
}

resource computes 'Microsoft.MachineLearningServices/workspaces/computes@2025-12-01' = [for cluster in clusters: {
  parent: workspace
  name: cluster.name
  location: location
  tags: tags
  identity: {
    type: cluster.identity
  }
  properties: {
    computeType: 'AmlCompute'
    disableLocalAuth: true
    properties: {
      vmSize: cluster.vmSize
      vmPriority: cluster.vmPriority
      osType: 'Linux'
      remoteLoginPortPublicAccess: 'Disabled'
      scaleSettings: {
        minNodeCount: cluster.minNodeCount
        maxNodeCount: cluster.maxNodeCount
        nodeIdleTimeBeforeScaleDown: 'PT${cluster.idleSeconds}S'
      }
    }
  }
}]

// Identity-based (no stored credentials): each job reaches them as its compute's identity, which roles.bicep
// grants Storage Blob Data Contributor on checkpoints and Storage Blob Data Reader on landing.
resource checkpointsDatastore 'Microsoft.MachineLearningServices/workspaces/datastores@2025-12-01' = {
  parent: workspace
  name: checkpointsDatastoreName
  properties: {
    datastoreType: 'AzureBlob'
    description: 'Retrain: checkpoints and the registry lock'
    accountName: storageAccountName
    containerName: checkpointsContainer
    endpoint: environment().suffixes.storage
    protocol: 'https'
    credentials: {
      credentialsType: 'None'
    }
    serviceDataAccessAuthIdentity: 'None'
  }
}

resource landingDatastore 'Microsoft.MachineLearningServices/workspaces/datastores@2025-12-01' = {
  parent: workspace
  name: landingDatastoreName
  properties: {
    datastoreType: 'AzureBlob'
    description: 'Retrain: the landed data and its pinned snapshots (the data assets <model>-raw)'
    accountName: storageAccountName
    containerName: landingContainer
    endpoint: environment().suffixes.storage
    protocol: 'https'
    credentials: {
      credentialsType: 'None'
    }
    serviceDataAccessAuthIdentity: 'None'
  }
}

output workspaceId string = workspace.id
output checkpointsDatastoreName string = checkpointsDatastore.name
output landingDatastoreName string = landingDatastore.name
output computeNames array = [for (cluster, i) in clusters: computes[i].name]
output computePrincipalIds array = [for (cluster, i) in clusters: computes[i].identity.principalId]
// The drift check (components/drift.yml) runs on the pipeline's default compute, the CPU cluster.
output driftPrincipalId string = computes[0].identity.principalId
