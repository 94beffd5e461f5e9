// Least-privilege role assignments, each on the narrowest scope its holder uses. The role definition ids are
// infra/roles.json's (one map, role name -> built-in GUID; tests/infra/ checks each GUID is the role it names).
//
//   Function App       Storage Blob Data Contributor on landing (reads batches, snapshots them beside the
//                      data: the data datastore), ledger, the deployment package and the host's two
//                      containers; AzureML Data Scientist on the workspace (data assets, pipeline jobs);
//                      Monitoring Metrics Publisher on Application Insights (telemetry with its identity)
//   each compute       Storage Blob Data Contributor on checkpoints (the pipeline's datastore: checkpoints,
//                      the registry lock); Storage Blob Data Reader on landing (the data datastore: the jobs
//                      read the pinned snapshots, and never write landing data)
//   drift compute      EventGrid Data Sender on the drift topic (when deployed)
//   storage topic      Storage Blob Data Contributor on dead-letter (identity-based dead-lettering)
//   workspace topic    Storage Blob Data Contributor on dead-letter
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
param deployDriftTopic bool
param driftTopicName string
@description('The deploying user (azd: AZURE_PRINCIPAL_ID); empty: no assignment for a user.')
param principalId string = ''

var roles = loadJsonContent('../roles.json')
var blobContributor = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Contributor'])
var blobReader = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Reader'])
var dataScientist = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['AzureML Data Scientist'])
var dataSender = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['EventGrid Data Sender'])
var metricsPublisher = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Monitoring Metrics Publisher'])

var functionAppContainers = [
  containers.landing
  containers.ledger
  containers.deployment
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]
var topicPrincipalIds = [storageTopicPrincipalId, workspaceTopicPrincipalId]

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

resource functionAppWorkspace 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: workspace
  name: guid(workspace.id, functionAppPrincipalId, dataScientist)
  properties: {
    roleDefinitionId: dataScientist
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
    principalType: 'User'
  }
}

resource deployerLanding 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  scope: landing
  name: guid(landing.id, principalId, blobContributor)
  properties: {
    roleDefinitionId: blobContributor
    principalId: principalId
    principalType: 'User'
  }
}

resource deployerLedger 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(principalId)) {
  scope: ledger
  name: guid(ledger.id, principalId, blobReader)
  properties: {
    roleDefinitionId: blobReader
    principalId: principalId
    principalType: 'User'
  }
}
