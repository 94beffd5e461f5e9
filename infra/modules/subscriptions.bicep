// The Event Grid subscriptions that deliver to the front door's functions. An AzureFunction endpoint is
// validated when the subscription is created, so these can exist only once the functions are published: this
// is its own resource-group deployment, not a module of main.bicep. The azd postdeploy hook
// (infra/hooks/postdeploy.sh) deploys it after every deploy of the code, with `az deployment group create`
// and main.bicep's outputs as its parameters (tests/infra/test_deploy_flow.py holds the two together).
//
// One subscription per served model's [trigger] scope. Its filters come from infra/event-routing.json, which
// `python -m infra.event_routing` writes from models/*.toml through the front door's own code, and which
// tests/infra/ holds equal to it: Bicep cannot read TOML.

param functionAppName string
param storageAccountName string
param deadLetterContainer string
param storageTopicName string
param workspaceTopicName string
param deployDriftTopic bool
param driftTopicName string

var routing = loadJsonContent('../event-routing.json')

resource functionApp 'Microsoft.Web/sites@2025-05-01' existing = {
  name: functionAppName
}

resource storageAccount 'Microsoft.Storage/storageAccounts@2026-09-01' existing = {
  name: storageAccountName
}

resource storageTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = {
  name: storageTopicName
}

resource workspaceTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = {
  name: workspaceTopicName
}

resource driftTopic 'Microsoft.EventGrid/topics@2025-02-15' existing = if (deployDriftTopic) {
  name: driftTopicName
}

// Event Grid retries a failed delivery for 24 h, 30 times at most, then writes the event to the dead-letter
// container with the topic's identity (a function that raises asks for exactly that retry).
resource blobSubscriptions 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = [for scope in routing.subscriptions: {
  parent: storageTopic
  name: 'retrain-${scope.model}'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/on_blob_created'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    filter: {
      includedEventTypes: [
        'Microsoft.Storage.BlobCreated'
      ]
      subjectBeginsWith: scope.subjectBeginsWith
      advancedFilters: [
        {
          operatorType: 'StringIn'
          key: 'data.api'
          values: routing.commitApis
        }
        {
          operatorType: 'StringEndsWith'
          key: 'subject'
          values: scope.suffixes
        }
      ]
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storageAccount.id
          blobContainerName: deadLetterContainer
        }
      }
    }
  }
}]

// Azure ML model monitoring's drift alerts. The workspace raises RunStatusChanged for every job in it, Retrain's
// own steps included; only a monitor signal run that breached a threshold carries the tag, with this message,
// so the filter Microsoft prescribes delivers those alone ("Monitor the performance of models deployed to
// production", section "Integrate Azure Machine Learning model monitoring with Azure Event Grid":
// https://learn.microsoft.com/azure/machine-learning/how-to-monitor-model-performance#integrate-azure-machine-learning-model-monitoring-with-azure-event-grid).
// The function's parser checks the tag again (function_app/events/drift_alerts.py).
resource workspaceSubscription 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: workspaceTopic
  name: 'retrain-drift'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/on_drift_alert'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    filter: {
      includedEventTypes: [
        routing.monitorEventType
      ]
      advancedFilters: [
        {
          operatorType: 'StringContains'
          key: 'data.RunTags.azureml_modelmonitor_threshold_breached'
          values: [
            'has failed due to one or more features violating metric thresholds'
          ]
        }
      ]
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storageAccount.id
          blobContainerName: deadLetterContainer
        }
      }
    }
  }
}

// Data drift v1's DatasetDriftDetected, on its own: its events carry no run tags, so the monitor's filter
// above would drop every one (a subscription's advanced filters must all match).
resource datasetDriftSubscription 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: workspaceTopic
  name: 'retrain-dataset-drift'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/on_drift_alert'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    filter: {
      includedEventTypes: [
        routing.datasetDriftEventType
      ]
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storageAccount.id
          blobContainerName: deadLetterContainer
        }
      }
    }
  }
}

// The drift check's own alert (Retrain.DriftDetected). Its dead letters are written with the custom topic's
// system-assigned identity (eventgrid.bicep), as the system topics' are.
resource driftSubscription 'Microsoft.EventGrid/topics/eventSubscriptions@2025-02-15' = if (deployDriftTopic) {
  parent: driftTopic
  name: 'retrain-drift-detected'
  properties: {
    eventDeliverySchema: 'EventGridSchema'
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/on_drift_alert'
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    filter: {
      includedEventTypes: [
        routing.driftDetectedEventType
      ]
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storageAccount.id
          blobContainerName: deadLetterContainer
        }
      }
    }
  }
}
