// Least-privilege role assignments, each on the narrowest scope its holder uses. The role definition ids are
// infra/roles.json's (one map, role name -> built-in GUID; tests/infra/ checks each GUID is the role it names).
//
//   Function App       Storage Blob Data Contributor on landing (reads batches, snapshots them beside the
//                      data: the data datastore), ledger, the deployment package and the host's two
//                      containers; the custom role frontDoorRole (below) on the workspace (data assets,
//                      pipeline jobs); Monitoring Metrics Publisher on Application Insights (its telemetry)
//   each compute       Storage Blob Data Contributor on checkpoints (the pipeline's datastore: checkpoints,
//                      the registry lock); Storage Blob Data Reader on landing (the data datastore: the jobs
//                      read the pinned snapshots, and never write landing data)
//   drift compute      EventGrid Data Sender on the drift topic (when deployed)
//                      Storage Blob Data Reader on the workspace's storage account (a new workspace's:
//                      without listsecrets, azure-ai-ml reads a step's output there with the app's token)
//   storage topic      Storage Blob Data Contributor on dead-letter (identity-based dead-lettering)
//   workspace topic    Storage Blob Data Contributor on dead-letter
//   drift topic        Storage Blob Data Contributor on dead-letter (when deployed)
//   deployer           AzureML Data Scientist on the workspace (`retrain publish` in the postprovision hook);
//                      Storage Blob Data Contributor on landing (the README's first upload) and Storage Blob
//                      Data Reader on ledger (`retrain ledger`: what became of it)

param storageAccountName string
param containers object
param functionAppPrincipalId string
param applicationInsightsName string
param workspaceName string
param computePrincipalIds array
param driftPrincipalId string
param storageTopicPrincipalId string
param workspaceTopicPrincipalId string
@description('The drift topic\'s identity (when deployed), which dead-letters like the system topics.')
param driftTopicPrincipalId string = ''
@description('A new workspace\'s storage account, where its jobs\' outputs lie; empty for an existing workspace (grant the Function App Storage Blob Data Reader there by hand: docs/deploying-by-hand.md).')
param workspaceStorageAccountName string = ''
param deployDriftTopic bool
param driftTopicName string
@description('The deploying user (azd: AZURE_PRINCIPAL_ID); empty: no assignment for a user.')
param principalId string = ''
@description('What principalId is (azd: AZURE_PRINCIPAL_TYPE): a user, or a service principal that runs azd.')
@allowed([
  'User'
  'ServicePrincipal'
])
param principalType string = 'User'

var roles = loadJsonContent('../roles.json')
var blobContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Contributor'])
var blobReader = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Reader'])
var dataScientist = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['AzureML Data Scientist'])
// The front door's Azure ML role: only what components/azureml/workspace.py (MLClientWorkspace) calls.
// AzureML Data Scientist would also hold workspaces/datastores/listsecrets/action, which hands out the
// workspace storage account's key (Azure ML's own account keeps shared keys on: the service, its computes
// and the studio use them, so switching them off is not ours to do), and workspaces/*/write|delete on every
// asset: too much for the internet-facing app. A custom role keeps the keys out of its reach instead.
// Without listsecrets, azure-ai-ml reads a job's output with the app's own token (_artifact_utilities).
var frontDoorActions = [
  'Microsoft.MachineLearningServices/workspaces/read' // MLClient resolves the workspace
  'Microsoft.MachineLearningServices/workspaces/jobs/read' // jobs.get, jobs.list(parent_job_name)
  'Microsoft.MachineLearningServices/workspaces/jobs/write' // jobs.create_or_update: submits the pipeline
  'Microsoft.MachineLearningServices/workspaces/experiments/read' // a job's experiment (one per model)
  'Microsoft.MachineLearningServices/workspaces/experiments/runs/read' // run history: a step's named output
  'Microsoft.MachineLearningServices/workspaces/experiments/runs/submit/action' // the submission's runs
  'Microsoft.MachineLearningServices/workspaces/data/read' // data.get: the pinned data versions
  'Microsoft.MachineLearningServices/workspaces/data/write'
  'Microsoft.MachineLearningServices/workspaces/data/versions/read'
  'Microsoft.MachineLearningServices/workspaces/data/versions/write' // data.create_or_update
  'Microsoft.MachineLearningServices/workspaces/datastores/read' // datastores.get (never listsecrets)
  'Microsoft.MachineLearningServices/workspaces/components/read' // the registered components a job names
  'Microsoft.MachineLearningServices/workspaces/components/versions/read'
  'Microsoft.MachineLearningServices/workspaces/environments/read'
  'Microsoft.MachineLearningServices/workspaces/environments/versions/read'
  'Microsoft.MachineLearningServices/workspaces/computes/read' // compute.get: a cluster's size and tier
  'Microsoft.MachineLearningServices/locations/vmsizes/read' // compute.list_sizes (the quota check)
  'Microsoft.MachineLearningServices/locations/usages/read' // compute.list_usage (the quota check)
]

var dataSender = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['EventGrid Data Sender'])
var metricsPublisher = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Monitoring Metrics Publisher'])

var functionAppContainers = [
  containers.landing
  containers.ledger
  containers.deployment
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]
var driftTopicPrincipalIds = deployDriftTopic && !empty(driftTopicPrincipalId) ? [driftTopicPrincipalId] : []
var topicPrincipalIds = concat([storageTopicPrincipalId, workspaceTopicPrincipalId], driftTopicPrincipalIds)

resource storageAccount 'Microsoft.Storage/storageAccounts@2026-09-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2026-09-01' existing = {
  parent: storageAccount
  name: 'default'
}

resource functionAppContainerScopes 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' existing = [for container in functionAppContainers: {
  parent: blobService
  name: container
}]

resource checkpoints 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' existing = {
  parent: blobService
  name: containers.checkpoints
}

resource landing 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' existing = {
  parent: blobService
  name: containers.landing
}

resource ledger 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' existing = {
  parent: blobService
  name: containers.ledger
}

resource deadLetter 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' existing = {
  parent: blobService
  name: containers.deadLetter
}

resource workspace 'Microsoft.MachineLearningServices/workspaces@2025-12-01' existing = {
  name: workspaceName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource driftTopic 'Microsoft.EventGrid/topics@2025-02-15' existing = if (deployDriftTopic) {
  name: driftTopicName
}

resource functionAppBlob 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (container, i) in functionAppContainers: {
  scope: functionAppContainerScopes[i]
  name: guid(functionAppContainerScopes[i].id, functionAppPrincipalId, blobContributor)
  properties: {
    roleDefinitionId: blobContributor
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// Assignable in this resource group only (the workspace's: main.bicep deploys this module there); named from
// a guid of that scope, and titled with it too, as a role's name must be unique in the tenant.
resource frontDoorRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(resourceGroup().id, 'retrain-front-door-azureml')
  properties: {
    roleName: 'Retrain front door (Azure ML) ${uniqueString(resourceGroup().id)}'
    description: 'Submit and follow Retrain pipeline jobs and pin data assets in an Azure ML workspace; no datastore secrets, no keys.'
    type: 'CustomRole'
    permissions: [
      {
        actions: frontDoorActions
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: [
      resourceGroup().id
    ]
  }
}

resource functionAppWorkspace 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: workspace
  name: guid(workspace.id, functionAppPrincipalId, frontDoorRole.id)
  properties: {
    roleDefinitionId: frontDoorRole.id
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionAppTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: applicationInsights
  name: guid(applicationInsights.id, functionAppPrincipalId, metricsPublisher)
  properties: {
    roleDefinitionId: metricsPublisher
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource computeCheckpoints 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (computePrincipalId, i) in computePrincipalIds: {
  scope: checkpoints
  name: guid(checkpoints.id, computePrincipalId, blobContributor)
  properties: {
    roleDefinitionId: blobContributor
    principalId: computePrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource computeLanding 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (computePrincipalId, i) in computePrincipalIds: {
  scope: landing
  name: guid(landing.id, computePrincipalId, blobReader)
  properties: {
    roleDefinitionId: blobReader
    principalId: computePrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource workspaceStorage 'Microsoft.Storage/storageAccounts@2026-09-01' existing = if (!empty(workspaceStorageAccountName)) {
  name: workspaceStorageAccountName
}

// The prep step's report and prepared-data output lie on the workspace's default datastore; the front door
// reads them after a run (components/azureml/submitter.py) with its own token, since it may not list keys.
resource functionAppWorkspaceOutputs 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(workspaceStorageAccountName)) {
  scope: workspaceStorage
  name: guid(resourceId('Microsoft.Storage/storageAccounts', workspaceStorageAccountName), functionAppPrincipalId, blobReader)
  properties: {
    roleDefinitionId: blobReader
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource topicDeadLetter 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (topicPrincipalId, i) in topicPrincipalIds: {
  scope: deadLetter
  name: guid(deadLetter.id, topicPrincipalId, blobContributor)
  properties: {
    roleDefinitionId: blobContributor
    principalId: topicPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

resource driftSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (deployDriftTopic) {
  scope: driftTopic
  name: guid(resourceId('Microsoft.EventGrid/topics', driftTopicName), driftPrincipalId, dataSender)
  properties: {
    roleDefinitionId: dataSender
    principalId: driftPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource deployerWorkspace 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  scope: workspace
  name: guid(workspace.id, principalId, dataScientist)
  properties: {
    roleDefinitionId: dataScientist
    principalId: principalId
    principalType: principalType
  }
}

resource deployerLanding 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  scope: landing
  name: guid(landing.id, principalId, blobContributor)
  properties: {
    roleDefinitionId: blobContributor
    principalId: principalId
    principalType: principalType
  }
}

resource deployerLedger 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  scope: ledger
  name: guid(ledger.id, principalId, blobReader)
  properties: {
    roleDefinitionId: blobReader
    principalId: principalId
    principalType: principalType
  }
}
