"""The internet-facing Function App holds no role that hands out keys or secrets, and the new workspace's
identity holds a role on its RBAC key vault.

Built-in roles are read from infra/roles.json and pinned (fixtures/builtin_roles.json, copied from Microsoft's
"Azure built-in roles"); the custom role from its definition in infra/modules/roles.bicep.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
from helpers.infra.bicep_checks import body, parse, text
from helpers.infra.infra_paths import FIXTURES, INFRA

PINNED = json.loads((FIXTURES / "builtin_roles.json").read_text())
FUNCTION_APP = "functionAppPrincipalId"
# What an internet-facing identity must never do: read keys or secrets. Each pattern is checked against
# the role's actions and dataActions, wildcards included, less its notActions/notDataActions.
FORBIDDEN = (
    "*/listsecrets/action",
    "*/listKeys/action",
    "*/listkeys/action",
    "Microsoft.KeyVault/vaults/keys/*read",
)
# Concrete operations those patterns stand for, to test a role's wildcards against (`*/action` reaches them).
SECRET_OPERATIONS = (
    "Microsoft.MachineLearningServices/workspaces/datastores/listsecrets/action",
    "Microsoft.MachineLearningServices/workspaces/connections/listsecrets/action",
    "Microsoft.MachineLearningServices/workspaces/listKeys/action",
    "Microsoft.MachineLearningServices/workspaces/computes/listKeys/action",
    "Microsoft.Storage/storageAccounts/listkeys/action",
    "Microsoft.KeyVault/vaults/keys/read",
)


def role_variables(parsed: dict[str, Any], roles: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """Each name a roleDefinitionId may be written as in a file -> that role's permissions."""
    found: dict[str, dict[str, list[str]]] = {}
    for variable, node in parsed.get("variables", {}).items():
        value = json.dumps(node["value"])  # subscriptionResourceId(..., roles['<name>']), as pycep reads it
        if '"subscription_resource_id"' not in value:
            continue
        for name, guid in roles.items():
            if json.dumps(name) in value:
                found[variable] = PINNED[guid]
    for name, resource in parsed["resources"].items():
        if resource["type"] == "Microsoft.Authorization/roleDefinitions":
            config, _ = body(resource)
            (permissions,) = config["properties"]["permissions"]
            actions = permissions["actions"]
            if isinstance(actions, str):  # a variable holding the list
                actions = parsed["variables"][actions]["value"]
            found[f"{name}.id"] = {**permissions, "actions": actions, "roleName": name}
    return found


def assigned_roles(infra: Path, principal: str) -> list[dict[str, Any]]:
    """The permissions of every role assigned to `principal` (a parameter name) in infra/modules/."""
    roles = json.loads((infra / "roles.json").read_text())
    held = []
    for path in sorted((infra / "modules").glob("*.bicep")):
        parsed = parse(path)
        variables = role_variables(parsed, roles)
        for name, resource in parsed["resources"].items():
            if resource["type"] != "Microsoft.Authorization/roleAssignments":
                continue
            config, _ = body(resource)
            if text(config["properties"]["principalId"]) != principal:
                continue
            role = text(config["properties"]["roleDefinitionId"])
            assert role in variables, f"{path.name}: {name} assigns {role!r}, a role this test cannot read"
            held.append(variables[role])
    return held


def reaches(held: list[str], excluded: list[str], operation: str) -> bool:
    def match(pattern: str) -> bool:
        return fnmatch.fnmatchcase(operation.lower(), pattern.lower())

    return any(match(p) for p in held) and not any(match(p) for p in excluded)


def forbidden_in(role: dict[str, Any]) -> list[str]:
    """What a role may do that it must not: a key or secret operation, or a wildcard on a workspace."""
    held = [*role.get("actions", []), *role.get("dataActions", [])]
    excluded = [*role.get("notActions", []), *role.get("notDataActions", [])]
    operations = [*SECRET_OPERATIONS, *(p for p in held if "*" not in p)]
    problems = [
        f"{role['roleName']}: {op}"
        for op in dict.fromkeys(operations)
        if reaches(held, excluded, op) and any(fnmatch.fnmatchcase(op.lower(), f.lower()) for f in FORBIDDEN)
    ]
    problems += [
        f"{role['roleName']}: {p} is a wildcard on workspaces"
        for p in held
        if "*" in p and p.lower().startswith("microsoft.machinelearningservices/workspaces")
    ]
    return problems


def test_every_role_infra_roles_json_names_is_pinned() -> None:
    roles = json.loads((INFRA / "roles.json").read_text())
    assert {guid: PINNED[guid]["roleName"] for guid in roles.values() if guid in PINNED} == {
        guid: name for name, guid in roles.items()
    }


def test_the_function_app_holds_roles_and_none_hands_out_keys_or_secrets() -> None:
    held = assigned_roles(INFRA, FUNCTION_APP)
    assert {r["roleName"] for r in held} >= {"frontDoorRole", "Storage Blob Data Contributor"}
    problems = [p for role in held for p in forbidden_in(role)]
    assert problems == []


def test_the_front_door_role_reads_datastores_but_not_their_secrets() -> None:
    [role] = [r for r in assigned_roles(INFRA, FUNCTION_APP) if r["roleName"] == "frontDoorRole"]
    assert "Microsoft.MachineLearningServices/workspaces/datastores/read" in role["actions"]
    assert "Microsoft.MachineLearningServices/workspaces/jobs/write" in role["actions"]
    assert not [a for a in role["actions"] if "*" in a or "secret" in a.lower() or "keys" in a.lower()]


def test_azureml_data_scientist_would_be_refused() -> None:
    # the built-in role the front door held before: its wildcards reach datastores/listsecrets/action
    assert forbidden_in(PINNED["f6c7c914-8db3-469d-8ca1-694a8f32e121"])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "'Microsoft.MachineLearningServices/workspaces/datastores/read'",
            "'Microsoft.MachineLearningServices/workspaces/datastores/listsecrets/action'",
        ),
        (
            "'Microsoft.MachineLearningServices/workspaces/data/read'",
            "'Microsoft.MachineLearningServices/workspaces/*'",
        ),
        ("roleDefinitionId: frontDoorRole.id", "roleDefinitionId: dataScientist"),
    ],
)
def test_a_planted_secret_reading_role_fails(tmp_path: Path, old: str, new: str) -> None:
    copy = tmp_path / "infra"
    import shutil

    shutil.copytree(INFRA, copy)
    roles = copy / "modules" / "roles.bicep"
    source = roles.read_text()
    assert old in source, f"roles.bicep no longer holds {old!r}: update the planted defect"
    roles.write_text(source.replace(old, new, 1))
    assert [p for role in assigned_roles(copy, FUNCTION_APP) for p in forbidden_in(role)]


def test_the_workspace_identity_holds_a_key_vault_role() -> None:
    parsed = parse(INFRA / "modules" / "workspace.bicep")
    roles = json.loads((INFRA / "roles.json").read_text())
    variables = role_variables(parsed, roles)
    on_vault = [
        variables.get(text(config["properties"]["roleDefinitionId"]), {}).get("roleName")
        for resource in parsed["resources"].values()
        if resource["type"] == "Microsoft.Authorization/roleAssignments"
        for config in [body(resource)[0]]
        if text(config["scope"]) == "keyVault"
        and text(config["properties"]["principalId"]) == "workspace.identity.principalId"
        and config["properties"].get("principalType") == "ServicePrincipal"
    ]
    assert on_vault == ["Key Vault Administrator"]


def test_the_function_app_reads_a_new_workspace_s_job_outputs_with_its_own_token():
    # Without listsecrets, azure-ai-ml reads a step's output from the workspace's default datastore with the
    # app's token: a new workspace's storage account must grant it Storage Blob Data Reader.
    main = (INFRA / "main.bicep").read_text().split("module roles ", 1)[1].split("\n}\n", 1)[0]
    assert "workspaceStorageAccountName: newWorkspace ? workspace.outputs.storageAccountName : ''" in main
    resource = parse(INFRA / "modules" / "roles.bicep")["resources"]["functionAppWorkspaceOutputs"]
    config, _ = body(resource)
    assert (config["scope"], config["properties"]["principalId"]) == ("workspaceStorage", FUNCTION_APP)
    assert config["properties"]["roleDefinitionId"] == "blobReader"
    assert "workspaceStorageAccountName" in json.dumps(resource["config"]["condition"])  # a new workspace's
