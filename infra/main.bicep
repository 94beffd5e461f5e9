// Retrain on Azure: the whole deployment, for `azd up` (azure.yaml) or
//   az deployment sub create -l <location> -f infra/main.bicep -p infra/main.parameters.json \
//     -p environmentName=<name> location=<location> [principalId=<your object id>]
// (later -p values win over the file's azd placeholders; every other parameter has a default).
//
// First deployment: an Event Grid subscription to an AzureFunction endpoint is validated when it is created,
// and `azd up` provisions before it deploys the code, so the subscriptions cannot exist on the first
// provision. They are their own module (modules/subscriptions.bicep), deployed when functionsPublished is
// true: the azd postdeploy hook (infra/hooks/postdeploy.sh) sets RETRAIN_FUNCTIONS_PUBLISHED=true once the
// code is published and provisions again; from then on every `azd up` keeps them. Without azd: deploy, publish
// the code (`func azure functionapp publish <functionAppName>`), then deploy again with -p functionsPublished=true.

targetScope = 'subscription'

@minLength(1)
@maxLength(48)
@description('Names the resource group (rg-<name>) and seeds every resource name.')
param environmentName string = 'retrain'

@minLength(1)
@description('Region of every resource.')
param location string = deployment().location

@description('Object id of the deploying user, granted AzureML Data Scientist for `retrain publish` (azd sets it); empty: none.')
param principalId string = ''

@description('An existing Azure ML workspace, in the deployment\'s resource group, to use instead of creating one.')
param existingWorkspaceName string = ''

@description('Whether the Function App\'s code is published: then the Event Grid subscriptions are deployed.')
param functionsPublished bool = false

@description('Whether to deploy the custom topic for Retrain.DriftDetected (the drift check\'s alert).')
param deployDriftTopic bool = false

var tags = {
  'azd-env-name': environmentName
}
var token = toLower(uniqueString(subscription().id, environmentName, location))
// The deployment account's containers; `landing` is also infra/event_routing.py's LANDING_CONTAINER.
var containers = {
  landing: 'landing'
  ledger: 'ledger'
  checkpoints: 'checkpoints'
  deadLetter: 'dead-letter'
  deployment: 'deployment-package'
}
// Two identity-based datastores in the workspace: the pipeline's (checkpoints and the registry lock), on the
// checkpoints container the compute writes; and the data datastore on the landing container, where the Function
// App copies each pinned snapshot beside the landed blobs and registers it as a data asset (a data asset's path
// is datastore-relative, so it must be this container's datastore). Kept apart so that the compute never
// writes landing data and no checkpoint lands in the container Event Grid watches.
var datastores = {
  checkpoints: 'retrain_checkpoints'
  landing: 'retrain_landing'
}
var routing = loadJsonContent('event-routing.json')
var newWorkspace = empty(existingWorkspaceName)

resource resourceGroup 'Microsoft.Resources/resourceGroups@2025-04-01' = {
  name: 'rg-${environmentName}'
  location: location
  tags: tags
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  scope: resourceGroup
  params: {
    name: 'st${token}'
    location: location
    tags: tags
    containers: containers
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  scope: resourceGroup
  params: {
    logAnalyticsName: 'log-${token}'
    applicationInsightsName: 'appi-${token}'
    location: location
    tags: tags
  }
}

module workspace 'modules/workspace.bicep' = if (newWorkspace) {
  name: 'workspace'
  scope: resourceGroup
  params: {
    name: 'mlw-${token}'
    location: location
    tags: tags
    storageAccountName: 'stml${token}'
    keyVaultName: 'kv-${token}'
    applicationInsightsId: monitoring.outputs.applicationInsightsId
  }
}

var workspaceName = newWorkspace ? workspace.outputs.name : existingWorkspaceName

module azureml 'modules/azureml.bicep' = {
  name: 'azureml'
  scope: resourceGroup
  params: {
    workspaceName: workspaceName
    location: location
    tags: tags
    storageAccountName: storage.outputs.name
    checkpointsContainer: containers.checkpoints
    landingContainer: containers.landing
    checkpointsDatastoreName: datastores.checkpoints
    landingDatastoreName: datastores.landing
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  scope: resourceGroup
  params: {
    name: 'func-${token}'
    planName: 'plan-${token}'
    location: location
    tags: tags
    storageAccountName: storage.outputs.name
    blobEndpoint: storage.outputs.blobEndpoint
    containers: containers
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    servedModels: routing.servedModels
    workspaceSubscriptionId: subscription().subscriptionId
    workspaceResourceGroup: resourceGroup.name
    workspaceName: workspaceName
    checkpointsDatastore: azureml.outputs.checkpointsDatastoreName
    landingDatastore: azureml.outputs.landingDatastoreName
  }
}

module eventGrid 'modules/eventgrid.bicep' = {
  name: 'eventgrid'
  scope: resourceGroup
  params: {
    location: location
    tags: tags
    storageTopicName: 'evgt-st-${token}'
    storageAccountId: storage.outputs.id
    workspaceTopicName: 'evgt-mlw-${token}'
    workspaceId: azureml.outputs.workspaceId
    workspaceLocation: location
    deployDriftTopic: deployDriftTopic
    driftTopicName: 'evgt-drift-${token}'
  }
}

module roles 'modules/roles.bicep' = {
  name: 'roles'
  scope: resourceGroup
  params: {
    storageAccountName: storage.outputs.name
    containers: containers
    functionAppPrincipalId: functionApp.outputs.principalId
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    workspaceName: workspaceName
    computePrincipalIds: azureml.outputs.computePrincipalIds
    driftPrincipalId: azureml.outputs.driftPrincipalId
    storageTopicPrincipalId: eventGrid.outputs.storageTopicPrincipalId
    workspaceTopicPrincipalId: eventGrid.outputs.workspaceTopicPrincipalId
    deployDriftTopic: deployDriftTopic
    driftTopicName: 'evgt-drift-${token}'
    principalId: principalId
  }
}

module subscriptions 'modules/subscriptions.bicep' = if (functionsPublished) {
  name: 'subscriptions'
  scope: resourceGroup
  params: {
    functionAppName: functionApp.outputs.name
    storageAccountName: storage.outputs.name
    deadLetterContainer: containers.deadLetter
    storageTopicName: eventGrid.outputs.storageTopicName
    workspaceTopicName: eventGrid.outputs.workspaceTopicName
    deployDriftTopic: deployDriftTopic
    driftTopicName: eventGrid.outputs.driftTopicName
  }
  // Dead-lettering with the topics' identities needs their roles first.
  dependsOn: [
    roles
  ]
}

// azd stores these in the environment (.azure/<env>/.env) and hands them to hooks as environment variables;
// the first three are what `retrain publish` and `retrain submit` read (components/azureml/workspace.py), and
// `retrain submit` reads the two RETRAIN_AZUREML_* datastores too (--datastore, --data-datastore).
output AZURE_SUBSCRIPTION_ID string = subscription().subscriptionId
output AZURE_RESOURCE_GROUP string = resourceGroup.name
output AZUREML_WORKSPACE string = workspaceName
output AZURE_LOCATION string = location
output RETRAIN_FUNCTION_APP string = functionApp.outputs.name
output RETRAIN_STORAGE_ACCOUNT string = storage.outputs.name
output RETRAIN_LANDING_URL string = '${storage.outputs.blobEndpoint}${containers.landing}'
output RETRAIN_LEDGER_URL string = '${storage.outputs.blobEndpoint}${containers.ledger}'
output RETRAIN_AZUREML_DATASTORE string = datastores.checkpoints
output RETRAIN_AZUREML_DATA_DATASTORE string = datastores.landing
output RETRAIN_DRIFT_TOPIC_ENDPOINT string = eventGrid.outputs.driftTopicEndpoint
