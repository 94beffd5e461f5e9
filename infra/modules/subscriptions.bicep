// The Event Grid subscriptions that deliver to the front door's functions. An AzureFunction endpoint is
// validated when the subscription is created, so these can exist only once the functions are published:
// main.bicep deploys this module when its parameter functionsPublished is true, which the azd postdeploy hook
// (infra/hooks/postdeploy.sh) sets after the first deploy of the code, then provisions again.
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

// Azure ML's own drift alerts: model monitoring's RunStatusChanged and data drift v1's DatasetDriftDetected.
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
      includedEventTypes: routing.driftEventTypes
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

// The drift check's own alert (Retrain.DriftDetected); a custom topic has no identity here, so its dead
// letters are not kept: the drift check runs again on its schedule.
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
  }
}
