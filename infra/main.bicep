// Retrain on Azure: the whole deployment, for `azd up` (azure.yaml) or
//   az deployment sub create -l <location> -f infra/main.bicep -p infra/main.parameters.json \
//     -p environmentName=<name> location=<location> [principalId=<your object id>]
// (later -p values win over the file's azd placeholders; every other parameter has a default).
//
// The Event Grid subscriptions are not in this deployment: a subscription to an AzureFunction endpoint is
// validated when it is created, and `azd up` provisions before it deploys the code. modules/subscriptions.bicep
// is its own resource-group deployment, made after the code by the azd postdeploy hook
// (infra/hooks/postdeploy.sh: `az deployment group create`, on every deploy, from this template's outputs below).
// Without azd: deploy this, publish the code (`func azure functionapp publish <functionAppName>`), then deploy
// modules/subscriptions.bicep into the resource group (docs/deploying-by-hand.md). No flag records that the code
// is published: nothing survives `azd down` to make the next first provision subscribe to functions that do
// not exist yet.

targetScope = 'subscription'

@minLength(1)
@maxLength(48)
@description('Names the resource group (rg-<name>) and seeds every resource name.')
param environmentName string = 'retrain'

// The regions where Azure Functions Flex Consumption (the Function App's plan) is offered: a snapshot of
// Microsoft Learn's "Flex Consumption plan" region list (https://learn.microsoft.com/azure/azure-functions/flex-consumption-plan)
// as of 2025, and the same as the official azd sample's, Azure-Samples/functions-quickstart-python-http-azd
// infra/main.bicep, less its canary region eastus2euap. Refresh it with `az functionapp list-flexconsumption-locations --query "sort_by(@, &name)[].name" -o tsv`.
// The GPU clusters' VM size (components/compute/gpu-*.yml) is offered in fewer regions: the azd preprovision
// hook checks it with `az vm list-skus` and stops with one line where it is not (README, "Deploying to Azure").
@minLength(1)
@description('Region of every resource: one where Azure Functions Flex Consumption is offered.')
@metadata({
  azd: {
    type: 'location'
  }
})
@allowed([
  'australiaeast'
  'australiasoutheast'
  'brazilsouth'
  'canadacentral'
  'centralindia'
  'centralus'
  'eastasia'
  'eastus'
  'eastus2'
  'francecentral'
  'germanywestcentral'
  'italynorth'
  'japaneast'
  'koreacentral'
  'northcentralus'
  'northeurope'
  'norwayeast'
  'southafricanorth'
  'southcentralus'
  'southeastasia'
  'southindia'
  'spaincentral'
  'swedencentral'
  'uaenorth'
  'uksouth'
  'ukwest'
  'westcentralus'
  'westeurope'
  'westus'
  'westus2'
  'westus3'
])
param location string = deployment().location

@description('Object id of the deploying user, granted AzureML Data Scientist for `retrain publish` (azd sets it); empty: none.')
param principalId string = ''

@description('What principalId is: a user, or a service principal (a pipeline that runs azd; azd sets AZURE_PRINCIPAL_TYPE).')
@allowed([
  'User'
  'ServicePrincipal'
])
param principalType string = 'User'

// The key vault (purge protection on) and the workspace stay soft-deleted under their names after `azd down`
// (a purge-protected vault cannot be purged, even by `azd down --purge`: its name is taken until its retention
// ends), so each incarnation names them afresh: the azd preprovision hook sets RETRAIN_NAME_SUFFIX once per
// environment and the postdown hook clears it, so the next `azd up` gets new names. Empty for a plain
// `az deployment sub create` (then a second deployment after a teardown needs a new suffix or environment name).
@maxLength(8)
@description('Lowercase letters and digits appended to the names of the resources soft-deleted by name.')
param nameSuffix string = ''

@description('An existing Azure ML workspace, in the deployment\'s resource group, to use instead of creating one.')
param existingWorkspaceName string = ''

@description('Whether to deploy the custom topic for Retrain.DriftDetected (the drift check\'s alert).')
param deployDriftTopic bool = false

var tags = {
  'azd-env-name': environmentName
}
var token = toLower(uniqueString(subscription().id, environmentName, location))
// 'kv-' + 13 + at most 8 = 24 characters, the key vault's limit; the workspace's and Log Analytics' limits are wider.
var incarnation = '${token}${toLower(nameSuffix)}'
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
    logAnalyticsName: 'log-${incarnation}'
    applicationInsightsName: 'appi-${token}'
    location: location
    tags: tags
  }
}

module workspace 'modules/workspace.bicep' = if (newWorkspace) {
  name: 'workspace'
  scope: resourceGroup
  params: {
    name: 'mlw-${incarnation}'
    location: location
    tags: tags
    storageAccountName: 'stml${token}'
    keyVaultName: 'kv-${incarnation}'
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

@description('The existing workspace\'s Event Grid system topic, if it has one (one per workspace): subscribed to instead of creating one. Empty: create one.')
param existingWorkspaceTopicName string = ''

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
    existingWorkspaceTopicName: existingWorkspaceTopicName
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
    driftTopicPrincipalId: eventGrid.outputs.driftTopicPrincipalId
    workspaceStorageAccountName: newWorkspace ? workspace.outputs.storageAccountName : ''
    deployDriftTopic: deployDriftTopic
    driftTopicName: 'evgt-drift-${token}'
    principalId: principalId
    principalType: principalType
  }
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
// What infra/hooks/postdeploy.sh hands modules/subscriptions.bicep (with RETRAIN_FUNCTION_APP and
// RETRAIN_STORAGE_ACCOUNT above), after the code is deployed.
output RETRAIN_DEAD_LETTER_CONTAINER string = containers.deadLetter
output RETRAIN_STORAGE_TOPIC string = eventGrid.outputs.storageTopicName
output RETRAIN_WORKSPACE_TOPIC string = eventGrid.outputs.workspaceTopicName
output RETRAIN_DRIFT_TOPIC_DEPLOYED bool = deployDriftTopic
output RETRAIN_DRIFT_TOPIC_NAME string = eventGrid.outputs.driftTopicName
