"""The templates' agreement with the code, as small checks over pycep-parser's parse of infra/ (the parser
checkov uses). Each check takes the infra folder (a copy in the planted-defect tests) and returns the
problems it found, one line each naming the file, the resource and what was expected; [] when it agrees."""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pycep import BicepParser

from components.azureml.workspace import WorkspaceRef
from components.errors import PipelineError
from components.submitters import AZUREML
from function_app.events.blob_created import COMMIT_APIS
from function_app.settings.app import AppSettings, SettingsError
from infra.event_routing import REGENERATE, event_routing

REPO_ROOT = Path(__file__).resolve().parents[3]
COMPUTE_DIR = REPO_ROOT / "components" / "compute"
# The front door's code, whose string constants name the settings it reads (docs/configuration.md's settings
# table is held equal to the same code by tests/function_app/settings/test_settings_docs.py).
SETTINGS_CODE = (REPO_ROOT / "function_app", REPO_ROOT / "components")
SETTING_CONSTANT = re.compile(r"[\"']((?:RETRAIN|AZURE|AZUREML)_[A-Z0-9]+(?:_[A-Z0-9]+)*)[\"']")
# The Functions host's own settings (not the front door's): its identity-based storage and telemetry
# connections, and the entry file. Flex Consumption refuses the two runtime settings.
HOST_PREFIXES = ("AzureWebJobsStorage__", "APPLICATIONINSIGHTS_")
ENTRY_SETTING = "PYTHON_SCRIPT_FILE_NAME"
REFUSED_BY_FLEX = ("FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION")
# Values only the deployment knows, as a deployment would fill them in.
DEPLOYMENT_VALUES = {
    "RETRAIN_BLOB_ACCOUNT": "stexample",
    "RETRAIN_LEDGER": "https://stexample.blob.core.windows.net/ledger",
    "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
    "AZURE_RESOURCE_GROUP": "rg-example",
    "AZUREML_WORKSPACE": "mlw-example",
}
# The datastores azureml.bicep creates, named in infra/main.bicep's `datastores` (setting -> key there) and
# handed to the Function App as that module's outputs: their names are checked as the app reads them.
DATASTORE_SETTINGS = {"RETRAIN_AZUREML_DATASTORE": "checkpoints", "RETRAIN_AZUREML_DATA_DATASTORE": "landing"}
# Microsoft's built-in roles (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles),
# copied from that page: the reference each of infra/roles.json's GUIDs is checked against.
BUILT_IN_ROLES = {
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Owner": "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    "AzureML Data Scientist": "f6c7c914-8db3-469d-8ca1-694a8f32e121",
    "EventGrid Data Sender": "d5a91429-5739-47e2-a06b-3470a27159e7",
    "Monitoring Metrics Publisher": "3913510d-42f4-4e42-8a64-420c390055eb",
    "Key Vault Administrator": "00482a5a-887f-4fb3-b363-3b7fe8e74483",
}
# Who must hold which role where (modules/roles.bicep): principal parameter, role, scope resource.
REQUIRED_ASSIGNMENTS = {
    ("functionAppPrincipalId", "Storage Blob Data Contributor", "functionAppContainerScopes"),
    ("functionAppPrincipalId", "frontDoorRole", "workspace"),  # the custom role roles.bicep defines
    ("functionAppPrincipalId", "Monitoring Metrics Publisher", "applicationInsights"),
    ("computePrincipalId", "Storage Blob Data Contributor", "checkpoints"),
    ("computePrincipalId", "Storage Blob Data Reader", "landing"),
    ("topicPrincipalId", "Storage Blob Data Contributor", "deadLetter"),
    ("driftPrincipalId", "EventGrid Data Sender", "driftTopic"),
    # The deployer: docs/deploying.md's first upload, and `retrain ledger` to see what became of it.
    ("principalId", "Storage Blob Data Contributor", "landing"),
    ("principalId", "Storage Blob Data Reader", "ledger"),
}
_TIERS = {"low_priority": "LowPriority", "dedicated": "Dedicated"}
_IDENTITIES = {"system_assigned": "SystemAssigned", "user_assigned": "UserAssigned"}


def parse(path: Path) -> dict[str, Any]:
    """pycep's parse of a file, once per distinct text (the planted copies share most files' texts)."""
    return copy.deepcopy(_parse_text(path.read_text()))


@functools.lru_cache(maxsize=64)
def _parse_text(source: str) -> dict[str, Any]:
    return BicepParser().parse(text=source)


def text(node: Any) -> str:
    """An expression as Bicep writes it, enough to compare: `a.b.c`, `x['k']`, literals as themselves."""
    if not isinstance(node, dict):
        return json.dumps(node) if not isinstance(node, str) else node
    if "operator" in node:
        operator = node["operator"]
        first, second = operator["operands"]["operand_1"], operator["operands"]["operand_2"]
        if operator["type"] == "property_accessor":
            return f"{text(first)}.{text(second)}"
        if operator["type"] == "index_accessor":
            return f"{text(first)}[{text(second)}]"
        return f"{text(first)} {operator['type']} {text(second)}"
    if "function" in node:
        return f"{node['function']['type']}(...)"
    return json.dumps(node, sort_keys=True)


def body(resource: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """(a resource's own properties, its loop array or None) under pycep's condition/loop wrappers."""
    config, loop = resource["config"], None
    while "config" in config and ("condition" in config or "loop_type" in config):
        if config.get("loop_type"):
            loop = config["loop_type"]["detail"]["array_name"]
        config = config["config"]
    return config, loop


def resources(infra: Path) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(file, symbolic name, the resource, its parse) of every resource in every .bicep under `infra`."""
    for path in sorted(infra.rglob("*.bicep")):
        parsed = parse(path)
        for name, resource in parsed.get("resources", {}).items():
            yield str(path.relative_to(infra.parent)), name, resource, parsed


# -- the functions the subscriptions target ------------------------------------------------------------


def check_function_targets(infra: Path, indexed: Mapping[str, str]) -> list[str]:
    """Every Event Grid subscription delivers to a function the worker indexes with an Event Grid trigger."""
    problems, targets = [], 0
    for file, name, resource, _ in resources(infra):
        if not resource["type"].endswith("/eventSubscriptions"):
            continue
        config, _ = body(resource)
        destination = config["properties"]["destination"]
        endpoint = text(destination["properties"]["resourceId"])
        function = endpoint.rsplit("/functions/", 1)[-1] if "/functions/" in endpoint else None
        targets += 1
        if destination["endpointType"] != "AzureFunction" or function is None:
            problems.append(f"{file}: {name} delivers to {endpoint!r}; expected an AzureFunction endpoint")
        elif indexed.get(function) != "eventGridTrigger":
            found = ", ".join(f"{key} ({kind})" for key, kind in sorted(indexed.items()))
            problems.append(
                f"{file}: {name} targets function {function!r}, which the worker does not index with "
                f"an Event Grid trigger; expected one of the indexed functions: {found}"
            )
    return (
        problems
        if targets
        else [f"{infra}: no Event Grid subscriptions; expected the functions' subscriptions"]
    )


# -- the subscriptions' filters ----------------------------------------------------------------------------


def check_event_routing(infra: Path) -> list[str]:
    """infra/event-routing.json is what the code derives from models/*.toml, and the blob subscriptions filter
    on it: one per scope, its subject prefix and suffixes, the commit APIs, 30 attempts, 24 h,
    dead letters."""
    routing_file = infra / "event-routing.json"
    routing = json.loads(routing_file.read_text())
    derived = event_routing(routing.get("servedModels", "*"), REPO_ROOT)
    problems = []
    if routing != derived:
        problems.append(
            f"{routing_file}: differs from what models/*.toml and the front door's code derive; expected it "
            f"regenerated: {REGENERATE}"
        )
    if derived["commitApis"] != list(COMMIT_APIS):
        problems.append(f"{routing_file}: commitApis; expected the front door's {list(COMMIT_APIS)}")
    blob = [
        (file, name, resource)
        for file, name, resource, _ in resources(infra)
        if resource["type"] == "Microsoft.EventGrid/systemTopics/eventSubscriptions"
        and "on_blob_created"
        in text(body(resource)[0]["properties"]["destination"]["properties"]["resourceId"])
    ]
    if len(blob) != 1:
        return [
            *problems,
            f"{infra}: {len(blob)} blob subscription resources; expected one, looped per scope",
        ]
    file, name, resource = blob[0]
    config, loop = body(resource)
    item = (
        resource["config"]["loop_type"]["detail"].get("item_name")
        if "loop_type" in resource["config"]
        else None
    )
    properties, where = config["properties"], f"{file}: {name}"
    filters = {f["key"]: f for f in properties["filter"].get("advancedFilters", [])}
    expected = {
        "the loop": (text(loop) if loop else None, "routing.subscriptions"),
        "event types": (properties["filter"].get("includedEventTypes"), ["Microsoft.Storage.BlobCreated"]),
        "subjectBeginsWith": (
            text(properties["filter"].get("subjectBeginsWith")),
            f"{item}.subjectBeginsWith",
        ),
        "data.api": (
            (
                filters.get("data.api", {}).get("operatorType"),
                text(filters.get("data.api", {}).get("values")),
            ),
            ("StringIn", "routing.commitApis"),
        ),
        "suffixes": (
            (filters.get("subject", {}).get("operatorType"), text(filters.get("subject", {}).get("values"))),
            ("StringEndsWith", f"{item}.suffixes"),
        ),
        "retryPolicy": (
            properties.get("retryPolicy"),
            {"maxDeliveryAttempts": 30, "eventTimeToLiveInMinutes": 1440},
        ),
        "dead letters": (
            "deadLetterWithResourceIdentity" in properties or "deadLetterDestination" in properties,
            True,
        ),
    }
    for what, (found, wanted) in expected.items():
        if found != wanted:
            problems.append(f"{where}: {what} is {found!r}; expected {wanted!r}")
    return problems


# -- the app settings -----------------------------------------------------------------------------------


def app_settings(infra: Path) -> dict[str, Any]:
    """The Function App's app settings, name -> value: a literal string, or None where the value is an
    expression (a parameter, a reference) the deployment fills in, with the parameter's name for
    parameters."""
    for _, _, resource, parsed in resources(infra):
        if resource["type"] == "Microsoft.Web/sites":
            config, _ = body(resource)
            entries = config["properties"]["siteConfig"]["appSettings"]
            parameters = parsed.get("parameters", {})
            return {entry["name"]: _setting_value(entry["value"], parameters) for entry in entries}
    raise AssertionError(f"{infra}: no Microsoft.Web/sites resource; expected the Function App")


def _setting_value(value: Any, parameters: Mapping[str, Any]) -> Any:
    if not isinstance(value, str) or "${" in value:
        return None
    return {"parameter": value} if value in parameters else value


def code_setting_names() -> set[str]:
    return {
        name
        for folder in SETTINGS_CODE
        for path in folder.rglob("*.py")
        for name in SETTING_CONSTANT.findall(path.read_text())
    }


def _load(environ: Mapping[str, str]) -> tuple[AppSettings, WorkspaceRef]:
    return AppSettings.from_environ(environ, cwd=REPO_ROOT), WorkspaceRef.from_settings(environ)


def check_app_settings(infra: Path) -> list[str]:
    """The Function App's settings are the host's and the front door's: each of the latter is a name the code
    reads, and together they start an Azure ML front door that serves event-routing.json's models with its
    ledger in Blob Storage; without any one of them it stops or behaves differently."""
    settings = app_settings(infra)
    routing = json.loads((infra / "event-routing.json").read_text())
    example = json.loads((REPO_ROOT / "local.settings.json.example").read_text())["Values"]
    problems = [
        f"{name} is set; Flex Consumption refuses it (functionAppConfig.runtime says it)"
        for name in REFUSED_BY_FLEX
        if name in settings
    ]
    if settings.get(ENTRY_SETTING) != example[ENTRY_SETTING]:
        problems.append(
            f"{ENTRY_SETTING} is {settings.get(ENTRY_SETTING)!r}; expected {example[ENTRY_SETTING]!r}"
        )
    if not any(name.startswith("AzureWebJobsStorage__") for name in settings):
        problems.append("no AzureWebJobsStorage__* setting; expected the host's identity-based storage")
    front_door = {
        name: value
        for name, value in settings.items()
        if name != ENTRY_SETTING and not name.startswith(HOST_PREFIXES) and name not in REFUSED_BY_FLEX
    }
    unknown = sorted(set(front_door) - code_setting_names())
    problems += [
        f"{name} is set, but the front door's code reads no such setting; expected a name from "
        "function_app/settings/"
        for name in unknown
    ]
    datastores = parse(infra / "main.bicep")["variables"]["datastores"]["value"]
    deployment = {**DEPLOYMENT_VALUES, **{name: datastores[key] for name, key in DATASTORE_SETTINGS.items()}}
    environ = {}
    for name, value in front_door.items():
        if isinstance(value, str):
            environ[name] = value
        elif value == {"parameter": "servedModels"}:
            environ[name] = routing["servedModels"]
        else:
            environ[name] = deployment.get(name, "deployment-value")
    try:
        loaded, _ = _load(environ)
    except (SettingsError, PipelineError) as error:
        return [*problems, f"the Function App's settings do not start the front door: {error}"]
    served = [route.name for route in loaded.models]
    expected_served = [entry["model"] for entry in routing["subscriptions"]]
    if loaded.submitter != AZUREML:
        problems.append(f"RETRAIN_SUBMITTER is {loaded.submitter!r}; expected {AZUREML!r}")
    if loaded.ledger_location.url is None:
        problems.append(
            "RETRAIN_LEDGER is a local folder; expected the ledger container's https URL (Flex has no "
            "lasting disk)"
        )
    if served != expected_served:
        problems.append(
            f"the front door serves {served}; expected event-routing.json's models {expected_served}"
        )
    for name in sorted(set(environ) - set(unknown)):
        try:
            if _load({key: value for key, value in environ.items() if key != name}) == _load(environ):
                problems.append(
                    f"{name} is set, but the front door behaves the same without it; expected only "
                    "settings it needs"
                )
        except (SettingsError, PipelineError):
            pass  # required
    return problems


# -- the computes ---------------------------------------------------------------------------------------


def check_computes(infra: Path, compute_dir: Path = COMPUTE_DIR) -> list[str]:
    """The clusters the template creates are components/compute/*.yml: name, size, tier, min/max instances,
    idle time before scale-down, identity."""
    parsed = parse(infra / "modules" / "azureml.bicep")
    clusters = {cluster["name"]: cluster for cluster in parsed["variables"]["clusters"]["value"]}
    problems = []
    for path in sorted(compute_dir.glob("*.yml")):
        spec = yaml.safe_load(path.read_text())
        cluster = clusters.pop(spec["name"], None)
        if cluster is None:
            problems.append(
                f"infra/modules/azureml.bicep: no cluster {spec['name']!r}; expected one per {path.name}"
            )
            continue
        expected = {
            "vmSize": spec["size"],
            "vmPriority": _TIERS[spec["tier"]],
            "minNodeCount": spec["min_instances"],
            "maxNodeCount": spec["max_instances"],
            "idleSeconds": spec["idle_time_before_scale_down"],
            "identity": _IDENTITIES[spec["identity"]["type"]],
        }
        for key, value in expected.items():
            if cluster.get(key) != value:
                problems.append(
                    f"infra/modules/azureml.bicep: cluster {spec['name']!r} {key} is {cluster.get(key)!r}; "
                    f"expected {value!r}, as components/compute/{path.name} says"
                )
    problems += [
        f"infra/modules/azureml.bicep: cluster {name!r} has no components/compute/*.yml; expected one"
        for name in clusters
    ]
    return problems


# -- the roles ------------------------------------------------------------------------------------------


def check_roles(infra: Path) -> list[str]:
    """infra/roles.json's GUIDs are the built-in roles they name; every role assignment takes its role from
    that map (no GUID typed elsewhere); and each identity holds the roles it needs where it needs them."""
    roles = json.loads((infra / "roles.json").read_text())
    problems = [
        f"infra/roles.json: {name!r} is {guid}; expected the built-in role's "
        f"{BUILT_IN_ROLES.get(name, 'name')}"
        for name, guid in roles.items()
        if BUILT_IN_ROLES.get(name) != guid
    ]
    parsed = parse(infra / "modules" / "roles.bicep")
    by_variable = {}
    for variable, node in parsed["variables"].items():
        function = node["value"].get("function", {}) if isinstance(node["value"], dict) else {}
        reference = (function.get("parameters") or {}).get("resource_name_1")
        if function.get("type") == "subscription_resource_id" and text(reference).startswith("roles["):
            by_variable[variable] = reference["operator"]["operands"]["operand_2"]
    for name, resource in parsed["resources"].items():  # a custom role defined beside its assignments
        if resource["type"] == "Microsoft.Authorization/roleDefinitions":
            by_variable[f"{name}.id"] = name
    assigned = set()
    for name, resource in parsed["resources"].items():
        if resource["type"] != "Microsoft.Authorization/roleAssignments":
            continue
        config, _ = body(resource)
        role_variable = text(config["properties"]["roleDefinitionId"])
        if role_variable not in by_variable:
            problems.append(
                f"infra/modules/roles.bicep: {name} names role {role_variable!r}; expected one from "
                "infra/roles.json"
            )
            continue
        assigned.add(
            (
                text(config["properties"]["principalId"]),
                by_variable[role_variable],
                text(config["scope"]).split("[")[0],
            )
        )
    for principal, role, scope in sorted(REQUIRED_ASSIGNMENTS - assigned):
        problems.append(
            f"infra/modules/roles.bicep: no {role!r} for {principal} on {scope}; expected that role "
            "assignment"
        )
    return problems
