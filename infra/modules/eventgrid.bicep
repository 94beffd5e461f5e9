// Event Grid's topics: a system topic on the storage account (Blob created), one on the Azure ML workspace
// (run status changes: model monitoring's drift alerts, data drift v1) and, optionally, the custom topic the
// drift check publishes Retrain.DriftDetected to. The subscriptions that deliver to the functions are in
// subscriptions.bicep, deployed once the functions exist (see main.bicep).

param location string
param tags object = {}
param storageTopicName string
param storageAccountId string
param workspaceTopicName string
param workspaceId string
param workspaceLocation string
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

resource workspaceTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: workspaceTopicName
  location: workspaceLocation
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: workspaceId
    topicType: 'Microsoft.MachineLearningServices.Workspaces'
  }
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
output workspaceTopicName string = workspaceTopic.name
output workspaceTopicPrincipalId string = workspaceTopic.identity.principalId
output driftTopicName string = deployDriftTopic ? driftTopic.name : ''
output driftTopicEndpoint string = deployDriftTopic ? driftTopic.properties.endpoint : ''
