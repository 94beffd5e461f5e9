// The front door: a Python 3.11 Function App on the Flex Consumption plan (FC1) with a system-assigned
// identity, which it uses for everything: the host's storage, its deployment package, Application Insights,
// the landing and ledger containers and the Azure ML workspace.
//
// The app settings below are the front door's own (function_app/settings/: RETRAIN_* and the three workspace
// settings of components/azureml/workspace.py) plus the host's. The names are checked against the code,
// not against a second list: tests/infra/ loads them with AppSettings.from_environ as the app would start, and
// requires that the full set starts an Azure ML front door that serves the models Event Grid routes, and that
// removing any one of them either stops start-up or changes what the front door does. A setting the code does
// not read, or one it requires and the template forgets, fails `make test`; the configuration reference in
// the README is held equal to the same code by tests/function_app/test_settings_docs.py.
// The two datastores come from the module that creates them (azureml.bicep): the pipeline's
// (RETRAIN_AZUREML_DATASTORE, checkpoints and the registry lock), and the data datastore on the landing
// container (RETRAIN_AZUREML_DATA_DATASTORE), where each pinned snapshot is registered; the app checks at every
// pin that the latter is on the landing container.
// Flex Consumption refuses FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION (functionAppConfig.runtime
// says both), so neither is set here.

param name string
param planName string
param location string
param tags object = {}
param storageAccountName string
param blobEndpoint string
param containers object
param applicationInsightsName string
param servedModels string
param workspaceSubscriptionId string
param workspaceResourceGroup string
param workspaceName string
param checkpointsDatastore string
param landingDatastore string
@description('Most instances the app scales out to.')
param maximumInstanceCount int = 40
@description('Memory of each instance, MB (2048 or 4096).')
param instanceMemoryMB int = 2048

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource plan 'Microsoft.Web/serverfarms@2025-05-01' = {
  // checkov:skip=CKV_AZURE_225: zone redundancy of a Flex Consumption plan is offered in some regions only, and refused elsewhere; a front door whose events Event Grid retries for 24 h rides out a zone outage
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource site 'Microsoft.Web/sites@2025-05-01' = {
  // checkov:skip=CKV_AZURE_222: Event Grid delivers to the functions over the public endpoint (there is no virtual network to reach a private one); HTTP needs a function key
  // checkov:skip=CKV_AZURE_17: Event Grid presents no client certificate; HTTP callers authenticate with a function key (authLevel FUNCTION)
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales from zero by design; Event Grid retries a delivery that meets a cold or failed instance, so no instance is kept warm (alwaysReady costs money all day)
  // checkov:skip=CKV_AZURE_213: Flex Consumption has no App Service health check; Application Insights records every invocation's failures
  name: name
  location: location
  tags: union(tags, { 'azd-service-name': 'front-door' })
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    clientCertEnabled: false
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}${containers.deployment}'
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      appSettings: [
        // The host's: identity-based connections to its storage and to Application Insights.
        {
          name: 'AzureWebJobsStorage__accountName'
          value: storageAccountName
        }
        {
          name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
          value: applicationInsights.properties.ConnectionString
        }
        {
          name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
          value: 'Authorization=AAD'
        }
        // The worker loads this root file; a package named function_app/ cannot be it (docs/architecture.md).
        {
          name: 'PYTHON_SCRIPT_FILE_NAME'
          value: 'function_entry.py'
        }
        // The front door's (function_app/settings/).
        {
          name: 'RETRAIN_SUBMITTER'
          value: 'azureml'
        }
        {
          name: 'RETRAIN_MODELS'
          value: servedModels
        }
        {
          name: 'RETRAIN_BLOB_ACCOUNT'
          value: storageAccountName
        }
        {
          name: 'RETRAIN_BLOB_CONTAINER'
          value: containers.landing
        }
        {
          name: 'RETRAIN_LEDGER'
          value: '${blobEndpoint}${containers.ledger}'
        }
        {
          name: 'AZURE_SUBSCRIPTION_ID'
          value: workspaceSubscriptionId
        }
        {
          name: 'AZURE_RESOURCE_GROUP'
          value: workspaceResourceGroup
        }
        {
          name: 'AZUREML_WORKSPACE'
          value: workspaceName
        }
        {
          name: 'RETRAIN_AZUREML_DATASTORE'
          value: checkpointsDatastore
        }
        {
          name: 'RETRAIN_AZUREML_DATA_DATASTORE'
          value: landingDatastore
        }
      ]
    }
  }
}

output name string = site.name
output id string = site.id
output principalId string = site.identity.principalId
