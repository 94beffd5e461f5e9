// Event Grid's topics: a system topic on the storage account (Blob created), one on the Azure ML workspace
// (run status changes: model monitoring's drift alerts, data drift v1) and, optionally, the custom topic the
// drift check publishes Retrain.DriftDetected to. The subscriptions that deliver to the functions are in
// subscriptions.bicep, deployed once the functions exist (see main.bicep). Every topic has a system-assigned
// identity, which writes its subscriptions' undeliverable events to the dead-letter container (roles.bicep).

param location string
param tags object = {}
param storageTopicName string
param storageAccountId string
param workspaceTopicName string
param workspaceId string
@description('The workspace\'s system topic, if it has one: Event Grid allows one system topic per source. Empty: create one.')
param existingWorkspaceTopicName string = ''
param deployDriftTopic bool
param driftTopicName string

// Its identity writes undeliverable events to the dead-letter container (roles.bicep).
resource storageTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: storageTopicName
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: storageAccountId
    topicType: 'Microsoft.Storage.StorageAccounts'
  }
}

var newWorkspaceTopic = empty(existingWorkspaceTopicName)

// The workspace, in this resource group, for its region: a system topic lives in its source's region.
resource workspace 'Microsoft.MachineLearningServices/workspaces@2025-12-01' existing = {
  name: last(split(workspaceId, '/'))
}

resource workspaceTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = if (newWorkspaceTopic) {
  name: workspaceTopicName
  location: workspace.location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: workspaceId
    topicType: 'Microsoft.MachineLearningServices.Workspaces'
  }
}

// The workspace's own system topic; it must have a system-assigned identity for the dead letters
// (az eventgrid system-topic update --identity systemassigned).
resource existingWorkspaceTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = if (!newWorkspaceTopic) {
  name: existingWorkspaceTopicName
}

// Publishers authenticate with Microsoft Entra ID only (EventGrid Data Sender, roles.bicep).
resource driftTopic 'Microsoft.EventGrid/topics@2025-02-15' = if (deployDriftTopic) {
  // checkov:skip=CKV_AZURE_191: the topic has a system-assigned identity (below); checkov does not read the body of a conditional resource (`if (deployDriftTopic)`)
  // checkov:skip=CKV_AZURE_192: local authentication is disabled (disableLocalAuth, below); checkov does not read the body of a conditional resource
  // checkov:skip=CKV_AZURE_193: the drift check publishes from Azure ML compute over the public endpoint; only identities granted EventGrid Data Sender may send
  name: driftTopicName
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    inputSchema: 'EventGridSchema'
    disableLocalAuth: true
    publicNetworkAccess: 'Enabled'
  }
}

output storageTopicName string = storageTopic.name
output storageTopicPrincipalId string = storageTopic.identity.principalId
output workspaceTopicName string = newWorkspaceTopic ? workspaceTopic.name : existingWorkspaceTopic.name
output workspaceTopicPrincipalId string = newWorkspaceTopic ? workspaceTopic.identity.principalId : existingWorkspaceTopic.identity.principalId
output driftTopicName string = deployDriftTopic ? driftTopic.name : ''
output driftTopicPrincipalId string = deployDriftTopic ? driftTopic.identity.principalId : ''
output driftTopicEndpoint string = deployDriftTopic ? driftTopic.properties.endpoint : ''
