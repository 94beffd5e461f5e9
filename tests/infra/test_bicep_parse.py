"""Every .bicep file parses with pycep-parser, the Bicep parser checkov is built on."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.infra.bicep_source import BicepParseError, parse_bicep
from helpers.infra.infra_paths import INFRA, VALID_FIXTURES, ids, infra_bicep_files


def test_the_deployment_has_its_azd_entry_point() -> None:
    assert (INFRA / "main.bicep").is_file(), "infra/main.bicep is missing: azd provisions from it"


@pytest.mark.parametrize("path", infra_bicep_files(), ids=ids(infra_bicep_files()))
def test_infra_file_parses(path: Path) -> None:
    parse_bicep(path)


@pytest.mark.parametrize("path", VALID_FIXTURES, ids=ids(VALID_FIXTURES))
def test_fixture_parses_with_its_resources(path: Path) -> None:
    assert list(parse_bicep(path).resources())


def test_an_unclosed_object_fails_naming_file_and_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.bicep"
    broken.write_text(
        "param location string\n"
        "resource sa 'Microsoft.Storage/storageAccounts@2026-09-01' = {\n"
        "  name: 'st'\n"
        "  location: location\n"
        "  properties: {\n"
        "    minimumTlsVersion 'TLS1_2'\n"  # the colon is missing
        "  }\n"
        "}\n"
    )
    with pytest.raises(BicepParseError, match=rf"^{broken}:6:\d+: pycep cannot parse this"):
        parse_bicep(broken)


def test_an_unclosed_multi_line_string_fails_naming_its_line(tmp_path: Path) -> None:
    broken = tmp_path / "string.bicep"
    broken.write_text("var a = 'x'\nvar text = '''\nnever closed\n")
    with pytest.raises(BicepParseError, match=rf"^{broken}:2: a multi-line string"):
        parse_bicep(broken)


def test_two_nested_child_resources_fail_instead_of_one_going_unchecked(tmp_path: Path) -> None:
    # pycep keeps only the last nested child of a body: the first would silently escape every check
    nested = tmp_path / "nested.bicep"
    nested.write_text(
        "resource sa 'Microsoft.Storage/storageAccounts@2026-09-01' = {\n"
        "  name: 'st'\n"
        "  resource blobs 'blobServices' = {\n"
        "    name: 'default'\n"
        "  }\n"
        "  resource queues 'queueServices' = {\n"
        "    name: 'default'\n"
        "  }\n"
        "}\n"
    )
    with pytest.raises(BicepParseError, match=r"two nested child resources.*`parent:`"):
        parse_bicep(nested)


def test_nested_child_resources_inherit_type_and_api_version(tmp_path: Path) -> None:
    nested = tmp_path / "nested.bicep"
    nested.write_text(
        "param names array\n"
        "resource sa 'Microsoft.Storage/storageAccounts@2026-09-01' = {\n"
        "  name: 'st'\n"
        "  resource blobs 'blobServices' = {\n"
        "    name: 'default'\n"
        "    resource c 'containers' = [for n in names: {\n"
        "      name: n\n"
        "    }]\n"
        "  }\n"
        "}\n"
    )
    resources = {r.symbol: r for r in parse_bicep(nested).resources()}
    container = resources["sa__blobs__c"]
    assert (container.type, container.api_version, container.line) == (
        "Microsoft.Storage/storageAccounts/blobServices/containers",
        "2026-09-01",
        6,
    )
    assert container.body["name"] == "n"
