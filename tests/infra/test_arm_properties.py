"""Every resource's properties are the ones Microsoft's REST models give its type at its API version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.infra.arm_check import check_file
from helpers.infra.bicep_source import parse_bicep
from helpers.infra.infra_paths import VALID_FIXTURES, ids, infra_bicep_files


def findings_in(text: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "planted.bicep"
    path.write_text(text)
    return [str(f) for f in check_file(parse_bicep(path))]


@pytest.mark.parametrize("path", infra_bicep_files(), ids=ids(infra_bicep_files()))
def test_infra_resources_match_their_rest_models(path: Path) -> None:
    findings = check_file(parse_bicep(path))
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize("path", VALID_FIXTURES, ids=ids(VALID_FIXTURES))
def test_fixture_resources_match_their_rest_models(path: Path) -> None:
    findings = check_file(parse_bicep(path))
    assert not findings, "\n".join(map(str, findings))


# Keys that are free-form by their model (tags are name: value pairs): a misspelling there is a new name.
FREE_FORM_KEYS = {"project"}
KEY_LINE = re.compile(r"^(\s+)([A-Za-z_][A-Za-z0-9_]*):(?=\s)", re.MULTILINE)


@pytest.mark.parametrize("path", VALID_FIXTURES, ids=ids(VALID_FIXTURES))
def test_every_key_of_a_fixture_is_checked(path: Path, tmp_path: Path) -> None:
    """Misspell each key of each resource body in turn: every one must be caught, at every depth, in
    polymorphic variants, loops and conditional branches alike."""
    text = path.read_text()
    # an `existing` resource is a reference to one deployed elsewhere: Bicep sends no body for it
    references = [range(r.line, r.end_line + 1) for r in parse_bicep(path).resources() if r.existing]
    keys = [
        (match, text.count("\n", 0, match.start()) + 1)
        for match in KEY_LINE.finditer(text)
        if match.group(2) not in FREE_FORM_KEYS
    ]
    keys = [(match, line) for match, line in keys if not any(line in lines for lines in references)]
    assert len(keys) > 5
    missed = []
    for match, line in keys:
        key = match.group(2)
        planted = text[: match.start(2)] + key + "x" + text[match.end(2) :]
        findings = findings_in(planted, tmp_path)
        # a misspelt discriminator leaves the discriminator missing
        if not any(f"{key}x: is not a property of" in f or f"{key}: is missing" in f for f in findings):
            missed.append(f"line {line}: {key} -> {findings}")
    assert not missed, "misspellings not caught:\n" + "\n".join(missed)


STORAGE = """
param location string = 'westeurope'
resource account 'Microsoft.Storage/storageAccounts@{api}' = {{
  name: 'stplanted'
  location: location
  kind: 'StorageV2'
  sku: {{
    name: 'Standard_LRS'
  }}
  properties: {{
    {key}: 'TLS1_2'
    supportsHttpsTrafficOnly: true
  }}
}}
"""


def test_a_misspelt_property_names_file_resource_path_and_the_right_name(tmp_path: Path) -> None:
    findings = findings_in(STORAGE.format(api="2026-09-01", key="minimumTLSVersion"), tmp_path)
    assert findings == [
        f"{tmp_path / 'planted.bicep'}:3: resource account (Microsoft.Storage/storageAccounts@2026-09-01): "
        "properties.minimumTLSVersion: is not a property of StorageAccountPropertiesCreateParameters; "
        "nearest: minimumTlsVersion"
    ]


def test_an_api_version_no_package_models_says_which_to_use(tmp_path: Path) -> None:
    (finding,) = findings_in(STORAGE.format(api="2023-05-01", key="minimumTlsVersion"), tmp_path)
    assert finding.endswith(
        "Microsoft.Storage/storageAccounts@2023-05-01: use API version 2026-09-01, the one "
        "azure-mgmt-storage 25.3.0 models (it models StorageAccountCreateParameters at: 2026-09-01)"
    )


def test_a_multi_api_package_checks_the_version_asked_for(tmp_path: Path) -> None:
    # azure-mgmt-authorization ships one sub-package per API version: each is the model of its version
    body = (
        "param principalId string\n"
        "resource ra 'Microsoft.Authorization/roleAssignments@{api}' = {{\n"
        "  name: guid(principalId)\n"
        "  properties: {{\n"
        "    roleDefinitionId: 'x'\n"
        "    principalId: principalId\n"
        "    {extra}\n"
        "  }}\n"
        "}}\n"
    )
    condition = "condition: '@Resource[x] == 1'\n    conditionVersion: '2.0'"
    assert findings_in(body.format(api="2022-04-01", extra=condition), tmp_path) == []
    findings = findings_in(body.format(api="2015-07-01", extra=condition), tmp_path)
    assert [f.split(": ", 2)[2].split(";")[0] for f in findings] == [
        "properties.condition: is not a property of RoleAssignmentProperties",
        "properties.conditionVersion: is not a property of RoleAssignmentProperties",
    ]
    (finding,) = findings_in(body.format(api="2021-01-01", extra=""), tmp_path)
    assert "use API version 2022-04-01, the one azure-mgmt-authorization 4.0.0 models" in finding
    assert "2020-10-01-preview" in finding


def test_an_unmodelled_resource_type_fails(tmp_path: Path) -> None:
    (finding,) = findings_in(
        "resource x 'Microsoft.Cache/redis@2024-03-01' = {\n  name: 'r'\n  properties: {}\n}\n", tmp_path
    )
    assert "resource type Microsoft.Cache/redis has no REST model here" in finding


COMPUTE = """
param location string
resource ws 'Microsoft.MachineLearningServices/workspaces@2025-12-01' existing = {{
  name: 'ws'
}}
resource cluster 'Microsoft.MachineLearningServices/workspaces/computes@2025-12-01' = {{
  parent: ws
  name: 'cpu'
  location: location
  properties: {{
    computeType: {compute_type}
    properties: {{
      vmSize: 'Standard_DS3_v2'
      {key}: {{
        minNodeCount: 0
        maxNodeCount: 2
      }}
    }}
  }}
}}
"""


def test_a_polymorphic_body_is_checked_against_its_variant(tmp_path: Path) -> None:
    ok = COMPUTE.format(compute_type="'AmlCompute'", key="scaleSettings")
    assert findings_in(ok, tmp_path) == []
    (finding,) = findings_in(COMPUTE.format(compute_type="'AmlCompute'", key="scaleSetings"), tmp_path)
    assert finding.endswith(
        "properties.properties.scaleSetings: is not a property of AmlComputeProperties; "
        "nearest: scaleSettings"
    )
    (finding,) = findings_in(COMPUTE.format(compute_type="'AmlComputes'", key="scaleSettings"), tmp_path)
    assert "properties.computeType: 'AmlComputes' is not a variant of Compute" in finding
    assert "did you mean AmlCompute" in finding


def test_a_discriminator_given_by_a_parameter_admits_any_variant_keys_only(tmp_path: Path) -> None:
    text = "param kind string\n" + COMPUTE.format(compute_type="kind", key="scaleSettings")
    assert findings_in(text, tmp_path) == []
    text = "param kind string\n" + COMPUTE.format(compute_type="kind", key="scaleSetings")
    (finding,) = findings_in(text, tmp_path)
    assert "properties.properties.scaleSetings: is not a property of" in finding


def test_read_only_properties_and_wrong_shapes_fail(tmp_path: Path) -> None:
    text = """
resource container 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-09-01' = {
  name: 'st/default/landing'
  properties: {
    publicAccess: 'None'
    lastModifiedTime: '2026-01-01T00:00:00Z'
    metadata: ['project']
    denyEncryptionScopeOverride: 'true'
    defaultEncryptionScope: {
      name: 'scope'
    }
  }
}
"""
    findings = [f.split(": ", 2)[2] for f in findings_in(text, tmp_path)]
    assert findings == [
        "properties.lastModifiedTime: is read-only in ContainerProperties: the resource provider sets it",
        "properties.metadata: is an array, but an object of name: value pairs is expected",
        "properties.denyEncryptionScopeOverride: is the literal 'true', but a bool is expected",
        "properties.defaultEncryptionScope: is an object, but a str is expected",
    ]


def test_object_literals_in_conditionals_and_loops_are_checked(tmp_path: Path) -> None:
    text = """
param strict bool
param rules array
resource account 'Microsoft.Storage/storageAccounts@2026-09-01' = {
  name: 'st'
  location: 'westeurope'
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    networkAcls: strict ? {
      defaultActon: 'Deny'
    } : {
      defaultAction: 'Allow'
      ipRules: [for rule in rules: {
        value: rule
        actoin: 'Allow'
      }]
    }
  }
}
"""
    findings = findings_in(text, tmp_path)
    assert [f.split(": ", 2)[2] for f in findings] == [
        "properties.networkAcls.defaultActon: is not a property of NetworkRuleSet; nearest: defaultAction",
        "properties.networkAcls.ipRules[for].actoin: is not a property of IPRule; nearest: action",
    ]
