"""The far side of one Azure ML workspace: its ARM routes on management.azure.com, and its blob storage.

Answers follow Azure ML's REST API (azure-rest-api-specs, specification/machinelearningservices/
resource-manager/Microsoft.MachineLearningServices, stable/2024-04-01, whose shapes the preview versions
azure-ai-ml sends share): a resource is {id, name, type, properties, systemData}; a missing one is a 404
with ARM's {"error": {"code", "message"}}; a PUT stores the resource and answers 201 with it; a schedule's
PUT is a long-running operation (201 + Azure-AsyncOperation, final state from the original URI).

Blob requests (the code snapshot that a component's `code` uploads) are relayed to Azurite, the real
emulator, under the account the workspace's datastore names: the bytes land where a test can read them.
"""

from __future__ import annotations

import copy
import datetime as dt
import http.client
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from helpers.components.loopback_arm import ARM_HOST, BLOB_SUFFIX, ML_PROVIDER, Response, Sent, arm_error

LOCATION = "westeurope"
_HOP_HEADERS = {"connection", "date", "keep-alive", "server", "transfer-encoding"}
_SYSTEM_DATA = {
    "createdAt": "2026-01-05T09:00:00.000Z",
    "createdBy": "retrain-tests",
    "createdByType": "Application",
    "lastModifiedAt": "2026-01-05T09:00:00.000Z",
    "lastModifiedBy": "retrain-tests",
    "lastModifiedByType": "Application",
}
# Resource types as ARM names them, by the path segment under the workspace.
_TYPES = {
    "jobs": "jobs",
    "computes": "computes",
    "datastores": "datastores",
    "schedules": "schedules",
}
_VERSIONED = ("codes", "components", "environments", "data", "models")


def _ws_path(sub: str, rg: str, ws: str) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/{ML_PROVIDER}/workspaces/{ws}"


@dataclass(frozen=True)
class Cluster:
    """An AmlCompute cluster as the workspace holds it."""

    name: str
    vm_size: str
    priority: str  # "Dedicated" or "LowPriority", as the REST API spells vmPriority
    max_nodes: int


@dataclass(frozen=True)
class VmSize:
    name: str
    family: str
    vcpus: int
    gpus: int


@dataclass(frozen=True)
class Usage:
    name: str
    type: str
    current: int
    limit: int


A100 = "standardNCADSA100v4Family"
DSV5 = "standardDSv5Family"


def standard_clusters() -> list[Cluster]:
    return [
        Cluster("gpu-spot", "Standard_NC24ads_A100_v4", "LowPriority", 4),
        Cluster("gpu-dedicated", "Standard_NC24ads_A100_v4", "Dedicated", 2),
        Cluster("cpu-cluster", "Standard_D4s_v5", "Dedicated", 4),
    ]


def standard_sizes() -> list[VmSize]:
    return [
        VmSize("Standard_NC24ads_A100_v4", A100, 24, 1),
        VmSize("Standard_NC96ads_A100_v4", A100, 96, 4),
        VmSize("Standard_D4s_v5", DSV5, 4, 0),
    ]


def standard_usages() -> list[Usage]:
    family = f"{ML_PROVIDER}/vmFamily/usages"
    return [
        Usage("Total Cluster Dedicated Regional vCPUs", f"{ML_PROVIDER}/dedicatedCores/usages", 8, 200),
        Usage("Standard NCADSA100v4 Family Cluster Dedicated vCPUs", family, 0, 48),
        Usage("Total Cluster LowPriority Regional vCPUs", f"{ML_PROVIDER}/lowPriorityCores/usages", 0, 96),
        Usage("Standard NCADSA100v4 Family Cluster LowPriority vCPUs", family, 0, -1),
    ]


@dataclass
class BlobAccount:
    """Where blob requests go: Azurite's endpoint for the account, and the key to sign SAS tokens with."""

    account: str
    endpoint: str  # http://127.0.0.1:<port>/<account>
    key: str = field(repr=False)


@dataclass
class WorkspaceFarSide:
    """One workspace's state, answering ARM requests as Azure ML does, and relaying blob requests."""

    subscription: str
    resource_group: str
    workspace: str
    storage: BlobAccount
    clusters: list[Cluster] = field(default_factory=standard_clusters)
    sizes: list[VmSize] = field(default_factory=standard_sizes)
    usages: list[Usage] = field(default_factory=standard_usages)
    datastore_container: str = "azureml-blobstore-5f0c8e1a-0b7d-4a4e-9d3e-2c1f6b8a7e90"
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)  # ARM path (lower) -> resource
    operations: dict[str, str] = field(default_factory=dict)  # async operation id -> resource path

    @property
    def prefix(self) -> str:
        return _ws_path(self.subscription, self.resource_group, self.workspace)

    def __post_init__(self) -> None:
        for cluster in self.clusters:
            self._put(f"{self.prefix}/computes/{cluster.name}", self._compute(cluster))
        self._put(f"{self.prefix}/datastores/workspaceblobstore", self._datastore("workspaceblobstore"))

    # -- the router --------------------------------------------------------------------------------------

    def __call__(self, sent: Sent) -> Response:
        if sent.host.endswith(BLOB_SUFFIX):
            return self._relay_blob(sent)
        if sent.host != ARM_HOST:
            return arm_error(404, "NotStandIn", f"no route for {sent.host}")
        path = sent.path
        subscription_level = f"/subscriptions/{self.subscription}/providers/{ML_PROVIDER}/locations/"
        if path.startswith(subscription_level):
            return self._location(sent, path.removeprefix(subscription_level))
        if not path.lower().startswith(self.prefix.lower()):
            return arm_error(404, "ResourceNotFound", f"The Resource '{path}' was not found.")
        rest = path[len(self.prefix) :].strip("/")
        if rest == "":
            return Response(200, self._workspace())
        parts = rest.split("/")
        if parts[0] in _VERSIONED:
            return self._versioned(sent, parts)
        if parts[0] == "datastores" and len(parts) == 3 and parts[2] == "listSecrets":
            return self._list_secrets(sent, parts[1])
        if parts[0] in _TYPES and len(parts) == 2:
            return self._resource(sent, parts[0], parts[1])
        if parts[0] == "jobs" and len(parts) == 1 and sent.method == "GET":
            return Response(200, self._list_jobs(sent))
        return arm_error(404, "NoRoute", f"no stand-in route for {sent.method} {path}")

    # -- resources --------------------------------------------------------------------------------------

    def _put(self, path: str, resource: dict[str, Any]) -> dict[str, Any]:
        self.resources[path.lower()] = resource
        return resource

    def get(self, path: str) -> dict[str, Any] | None:
        return self.resources.get(path.lower())

    def _arm(self, path: str, kind: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": path,
            "name": path.rsplit("/", 1)[-1],
            "type": f"{ML_PROVIDER}/workspaces/{kind}",
            "properties": properties,
            "systemData": dict(_SYSTEM_DATA),
            **extra,
        }

    def _workspace(self) -> dict[str, Any]:
        rg = f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers"
        return {
            "id": self.prefix,
            "name": self.workspace,
            "type": f"{ML_PROVIDER}/workspaces",
            "location": LOCATION,
            "kind": "Default",
            "identity": {"type": "SystemAssigned"},
            "sku": {"name": "Basic", "tier": "Basic"},
            "properties": {
                "workspaceId": "5f0c8e1a-0b7d-4a4e-9d3e-2c1f6b8a7e90",
                "friendlyName": self.workspace,
                "discoveryUrl": f"https://{LOCATION}.api.azureml.ms/discovery",
                "storageAccount": f"{rg}/Microsoft.Storage/storageAccounts/{self.storage.account}",
                "keyVault": f"{rg}/Microsoft.KeyVault/vaults/kv-{self.workspace}",
                "applicationInsights": f"{rg}/Microsoft.Insights/components/ai-{self.workspace}",
                "mlFlowTrackingUri": (f"azureml://{LOCATION}.api.azureml.ms/mlflow/v1.0{self.prefix}"),
                "provisioningState": "Succeeded",
                "publicNetworkAccess": "Enabled",
            },
            "systemData": dict(_SYSTEM_DATA),
        }

    def _compute(self, cluster: Cluster) -> dict[str, Any]:
        path = f"{self.prefix}/computes/{cluster.name}"
        return self._arm(
            path,
            "computes",
            {
                "computeType": "AmlCompute",
                "computeLocation": LOCATION,
                "provisioningState": "Succeeded",
                "isAttachedCompute": False,
                "disableLocalAuth": True,
                "properties": {
                    "osType": "Linux",
                    "vmSize": cluster.vm_size,
                    "vmPriority": cluster.priority,
                    "scaleSettings": {
                        "maxNodeCount": cluster.max_nodes,
                        "minNodeCount": 0,
                        "nodeIdleTimeBeforeScaleDown": "PT2M",
                    },
                    "allocationState": "Steady",
                    "currentNodeCount": 0,
                    "targetNodeCount": 0,
                    "remoteLoginPortPublicAccess": "Disabled",
                },
            },
            location=LOCATION,
        )

    def _datastore(self, name: str) -> dict[str, Any]:
        """The workspace's default datastore as Azure ML creates it: AzureBlob, account key credentials."""
        return self._arm(
            f"{self.prefix}/datastores/{name}",
            "datastores",
            {
                "datastoreType": "AzureBlob",
                "accountName": self.storage.account,
                "containerName": self.datastore_container,
                "endpoint": "core.windows.net",
                "protocol": "https",
                "credentials": {"credentialsType": "AccountKey"},
                "serviceDataAccessAuthIdentity": "WorkspaceSystemAssignedIdentity",
                "isDefault": True,
                "description": "",
                "properties": {},
                "tags": {},
            },
        )

    def _list_secrets(self, sent: Sent, name: str) -> Response:
        if sent.method != "POST" or self.get(f"{self.prefix}/datastores/{name}") is None:
            return arm_error(404, "ResourceNotFound", f"datastore {name} not found")
        return Response(200, {"secretsType": "AccountKey", "key": self.storage.key})

    def _location(self, sent: Sent, rest: str) -> Response:
        location, _, what = rest.partition("/")
        if what == "vmSizes":
            return Response(
                200,
                {
                    "value": [
                        {
                            "name": size.name,
                            "family": size.family,
                            "vCPUs": size.vcpus,
                            "gpus": size.gpus,
                            "osVhdSizeMB": 1047552,
                            "maxResourceVolumeMB": 65536,
                            "memoryGB": 220.0 if size.gpus else 16.0,
                            "lowPriorityCapable": True,
                            "premiumIO": True,
                            "supportedComputeTypes": ["AmlCompute", "ComputeInstance"],
                        }
                        for size in self.sizes
                    ]
                },
            )
        if what == "usages":
            return Response(
                200,
                {
                    "value": [
                        {
                            "id": f"/subscriptions/{self.subscription}/providers/{ML_PROVIDER}/locations/"
                            f"{location}/usages/{row.name.replace(' ', '')}",
                            "amlWorkspaceLocation": location,  # the spec's Usage wire name
                            "type": row.type,
                            "unit": "Count",
                            "currentValue": row.current,
                            "limit": row.limit,
                            "name": {"value": row.name, "localizedValue": row.name},
                        }
                        for row in self.usages
                    ],
                    "nextLink": None,
                },
            )
        if what.startswith("mfeOperationsStatus/"):
            return self._operation_status(what.rsplit("/", 1)[-1])
        return arm_error(404, "NoRoute", f"no stand-in route for {sent.method} {sent.path}")

    def _resource(self, sent: Sent, kind: str, name: str) -> Response:
        path = f"{self.prefix}/{kind}/{name}"
        if sent.method == "GET":
            found = self.get(path)
            if found is None:
                return arm_error(404, "UserError", f"{kind[:-1].capitalize()} {name} was not found.")
            return Response(200, found)
        if sent.method == "PUT" and kind == "jobs":
            return self._put_job(sent, path, name)
        if sent.method == "PUT" and kind == "schedules":
            return self._put_schedule(sent, path)
        return arm_error(405, "MethodNotAllowed", f"{sent.method} {path}")

    def _put_job(self, sent: Sent, path: str, name: str) -> Response:
        if self.get(path) is not None:  # a job name is unique in a workspace, and a job is never replaced
            return arm_error(409, "UserError", f"A job with this name already exists: {name}")
        properties = copy.deepcopy(sent.body["properties"])
        properties["status"] = "NotStarted"
        properties["services"] = {
            "Studio": {
                "jobServiceType": "Studio",
                "endpoint": f"https://ml.azure.com/runs/{name}?wsid={self.prefix}",
            },
            "Tracking": {
                "jobServiceType": "Tracking",
                "endpoint": f"azureml://{LOCATION}.api.azureml.ms/mlflow/v1.0{self.prefix}",
            },
        }
        return Response(201, self._put(path, self._arm(path, "jobs", properties)))

    def _list_jobs(self, sent: Sent) -> dict[str, Any]:
        parent = sent.query.get("parentJobName")
        jobs = [
            resource
            for key, resource in self.resources.items()
            if key.startswith(f"{self.prefix}/jobs/".lower())
            and resource["properties"].get("parentJobName", None) == parent
        ]
        return {"value": jobs, "nextLink": None}

    def _put_schedule(self, sent: Sent, path: str) -> Response:
        """Schedules - Create Or Update: 201 with provisioningState Creating and an Azure-AsyncOperation."""
        properties = copy.deepcopy(sent.body["properties"])
        properties["provisioningState"] = "Creating"
        properties.setdefault("isEnabled", True)
        self._put(path, self._arm(path, "schedules", properties))
        operation = str(uuid.uuid4())
        self.operations[operation] = path
        status_url = (
            f"https://{ARM_HOST}/subscriptions/{self.subscription}/providers/{ML_PROVIDER}/locations/"
            f"{LOCATION}/mfeOperationsStatus/{operation}?api-version={sent.api_version}"
        )
        return Response(
            201,
            self.get(path),
            {"Azure-AsyncOperation": status_url, "x-ms-async-operation-timeout": "PT1H"},
        )

    def _operation_status(self, operation: str) -> Response:
        """The operation is over: its resource is provisioned, and the status says Succeeded."""
        path = self.operations.get(operation)
        if path is None:
            return arm_error(404, "ResourceNotFound", f"operation {operation} not found")
        resource = self.resources[path.lower()]
        resource["properties"]["provisioningState"] = "Succeeded"
        now = dt.datetime.now(dt.UTC).isoformat()
        return Response(
            200, {"id": operation, "name": operation, "status": "Succeeded", "startTime": now, "endTime": now}
        )

    # -- versioned assets: environments, components, codes, data -------------------------------------------

    def _versioned(self, sent: Sent, parts: list[str]) -> Response:
        kind = parts[0]
        if len(parts) == 2 and sent.method == "GET":  # the container: its latest version
            found = self.get(f"{self.prefix}/{kind}/{parts[1]}")
            if found is None:
                return arm_error(404, "UserError", f"Could not find asset with name {parts[1]}.")
            return Response(200, found)
        if len(parts) == 3 and parts[2] == "versions" and sent.method == "GET":
            return Response(200, self._list_versions(sent, kind, parts[1]))
        if len(parts) == 5 and parts[4] == "startPendingUpload" and sent.method == "POST":
            return self._start_pending_upload(sent, kind, parts[1], parts[3])
        if len(parts) != 4 or parts[2] != "versions":
            return arm_error(404, "NoRoute", f"no stand-in route for {sent.method} {sent.path}")
        name, version = parts[1], parts[3]
        path = f"{self.prefix}/{kind}/{name}/versions/{version}"
        if sent.method == "GET":
            found = self.get(path)
            if found is None:
                return arm_error(
                    404, "UserError", f"Could not find asset with name {name} and version {version}."
                )
            return Response(200, found)
        if sent.method == "PUT":
            # A version is immutable: PUT of the same body again is accepted, of another body refused.
            existing = self.get(path)
            properties = copy.deepcopy(sent.body["properties"])
            if existing is not None:
                return Response(200, existing)
            return Response(201, self.add_version(kind, name, version, properties))
        return arm_error(405, "MethodNotAllowed", f"{sent.method} {path}")

    def add_version(self, kind: str, name: str, version: str, properties: dict[str, Any]) -> dict[str, Any]:
        """Store an asset version, and its container with the version as the latest."""
        container = f"{self.prefix}/{kind}/{name}"
        self._put(container, self._arm(container, kind, {"latestVersion": version, "isArchived": False}))
        path = f"{container}/versions/{version}"
        return self._put(
            path, self._arm(path, f"{kind}/versions", {**properties, "provisioningState": "Succeeded"})
        )

    def _list_versions(self, sent: Sent, kind: str, name: str) -> dict[str, Any]:
        """Versions of an asset. With `hash`, the service finds code by its content hash under any name
        (the SDK asks under a fresh name and reuses whatever it finds): a snapshot is uploaded once."""
        wanted = sent.query.get("hash")
        start = (
            f"{self.prefix}/{kind}/".lower() if wanted else f"{self.prefix}/{kind}/{name}/versions/".lower()
        )
        found = [
            resource
            for key, resource in self.resources.items()
            if key.startswith(start)
            and "/versions/" in key
            and (wanted is None or resource["properties"].get("properties", {}).get("hash_sha256") == wanted)
        ]
        return {"value": found, "nextLink": None}

    def _start_pending_upload(self, sent: Sent, kind: str, name: str, version: str) -> Response:
        """A temporary container in the workspace's storage and a SAS to write it, for one upload."""
        from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, generate_container_sas

        pending = str(uuid.uuid4())
        container = f"{self.workspace.lower()}-{pending}"[:63].rstrip("-")
        service = BlobServiceClient(self.storage.endpoint, credential=self._shared_key())
        service.create_container(container)
        sas = generate_container_sas(
            self.storage.account,
            container,
            account_key=self.storage.key,
            permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, list=True),
            expiry=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
        )
        blob_uri = f"https://{self.storage.account}{BLOB_SUFFIX}/{container}"
        return Response(
            200,
            {
                "blobReferenceForConsumption": {
                    "blobUri": blob_uri,
                    "storageAccountArmId": f"/subscriptions/{self.subscription}/resourceGroups/"
                    f"{self.resource_group}/providers/Microsoft.Storage/storageAccounts/{self.storage.account}",
                    "credential": {"credentialType": "SAS", "sasUri": f"{blob_uri}?{sas}"},
                },
                "pendingUploadId": pending,
                "pendingUploadType": "TemporaryBlobReference",
            },
        )

    def _shared_key(self) -> dict[str, str]:
        return {"account_name": self.storage.account, "account_key": self.storage.key}

    # -- blob storage: relayed to Azurite -----------------------------------------------------------------

    def _relay_blob(self, sent: Sent) -> Response:
        account = sent.host.removesuffix(BLOB_SUFFIX)
        if account != self.storage.account:
            return Response(404, b"", {"x-ms-error-code": "ResourceNotFound"})
        upstream = urlsplit(self.storage.endpoint)
        target = f"{upstream.path}{sent.target}"
        connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
        try:
            headers = {
                k: v for k, v in sent.headers.items() if k not in _HOP_HEADERS | {"host", "content-length"}
            }
            connection.request(sent.method, target, body=sent.raw or None, headers=headers)
            reply = connection.getresponse()
            payload = reply.read()
            kept = {k: v for k, v in reply.getheaders() if k.lower() not in _HOP_HEADERS}
            if sent.method != "HEAD":
                kept = {k: v for k, v in kept.items() if k.lower() != "content-length"}
            return Response(reply.status, payload, kept)
        finally:
            connection.close()
