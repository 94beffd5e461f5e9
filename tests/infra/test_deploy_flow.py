"""`azd up`, `azd down`, `azd up` again, as azd runs them: the hooks azure.yaml names run for real, with a
fake `azd` and `az` on PATH that record their arguments and keep the environment's values; and the templates
hold what that flow relies on (no provision inside a hook, subscriptions deployed after the code from
main.bicep's outputs, fresh names for what stays soft-deleted, the deployer's principal type, the regions)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.infra.bicep_checks import REPO_ROOT, body, parse, text

INFRA = REPO_ROOT / "infra"
MAIN = INFRA / "main.bicep"
SUBSCRIPTIONS = INFRA / "modules" / "subscriptions.bicep"
# Azure Functions Flex Consumption's regions, a 2025 snapshot of Microsoft Learn's "Flex Consumption plan"
# region list (https://learn.microsoft.com/azure/azure-functions/flex-consumption-plan); refresh with
# `az functionapp list-flexconsumption-locations --query "sort_by(@, &name)[].name" -o tsv`.
FLEX_CONSUMPTION_REGIONS = [
    "australiaeast",
    "australiasoutheast",
    "brazilsouth",
    "canadacentral",
    "centralindia",
    "centralus",
    "eastasia",
    "eastus",
    "eastus2",
    "francecentral",
    "germanywestcentral",
    "italynorth",
    "japaneast",
    "koreacentral",
    "northcentralus",
    "northeurope",
    "norwayeast",
    "southafricanorth",
    "southcentralus",
    "southeastasia",
    "southindia",
    "spaincentral",
    "swedencentral",
    "uaenorth",
    "uksouth",
    "ukwest",
    "westcentralus",
    "westeurope",
    "westus",
    "westus2",
    "westus3",
]
GPU_SIZE = "Standard_NC24ads_A100_v4"  # components/compute/gpu-*.yml

# The fakes: each call is one JSON line in $FAKE_LOG; `azd env set` keeps $FAKE_ENV (a JSON object);
# `az deployment group create` fails $FAKE_AZ_FAILURES times first ("always": every time).
_FAKE_AZD = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"program": "azd", "argv": args}}) + "\\n")
if args[:2] == ["env", "set"]:
    rest = args[2:]
    if rest[0] in ("--environment", "-e"):
        assert rest[1] == os.environ["AZURE_ENV_NAME"], rest
        rest = rest[2:]
    key, value = rest
    values = json.load(open(os.environ["FAKE_ENV"]))
    values[key] = value
    json.dump(values, open(os.environ["FAKE_ENV"], "w"))
elif args[:2] == ["env", "get-value"]:
    print(json.load(open(os.environ["FAKE_ENV"])).get(args[2], ""))
else:
    sys.exit("fake azd: nothing but `env set` and `env get-value` is expected from a hook")
"""
_FAKE_AZ = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"program": "az", "argv": args, "cwd": os.getcwd()}}) + "\\n")
if args[:2] == ["vm", "list-skus"]:
    print(os.environ.get("FAKE_AZ_SKUS", ""))
elif args[:3] == ["deployment", "group", "create"]:
    counter = os.environ["FAKE_LOG"] + ".deployments"
    count = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(count + 1))
    failures = os.environ.get("FAKE_AZ_FAILURES", "0")
    if failures == "always" or count < int(failures):
        sys.exit("ERROR: (AuthorizationFailed) the topic's identity may not write to dead-letter")
else:
    sys.exit("fake az: unexpected " + " ".join(args))
"""


def hook_scripts() -> dict[str, Path]:
    """The hooks azure.yaml names, by event."""
    config = yaml.safe_load((REPO_ROOT / "azure.yaml").read_text())
    return {event: REPO_ROOT / spec["posix"]["run"] for event, spec in config["hooks"].items()}


def command_lines(script: Path) -> list[str]:
    return [line for line in script.read_text().splitlines() if not line.lstrip().startswith("#")]


def main_outputs() -> dict[str, Any]:
    return parse(MAIN)["outputs"]


class FakeAzd:
    """azd's order of work for `up` and `down`, running the real hooks; provisioning writes main.bicep's
    outputs to the environment, as azd does."""

    def __init__(self, root: Path, **environ: str) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for name, source in (("azd", _FAKE_AZD), ("az", _FAKE_AZ)):
            path = self.bin / name
            path.write_text(source.format(python=sys.executable))
            path.chmod(0o755)
        self.env_file = root / "env.json"
        self.env_file.write_text(json.dumps({"AZURE_ENV_NAME": "dev", "AZURE_LOCATION": "swedencentral"}))
        self.log = root / "calls.jsonl"
        self.log.touch()
        self.environ = {"FAKE_AZ_SKUS": GPU_SIZE, **environ}
        self.hooks = hook_scripts()

    @property
    def values(self) -> dict[str, str]:
        return json.loads(self.env_file.read_text())

    def calls(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def step(self, name: str) -> None:
        with self.log.open("a") as log:
            log.write(json.dumps({"program": "step", "argv": [name]}) + "\n")

    def hook(self, event: str, **environ: str) -> subprocess.CompletedProcess[str]:
        self.step(event)
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "FAKE_LOG": str(self.log),
            "FAKE_ENV": str(self.env_file),
            "RETRAIN_SUBSCRIPTIONS_WAIT_SECONDS": "0",
            **self.values,
            **self.environ,
            **environ,
        }
        # azd runs a `shell: sh` hook with bash
        return subprocess.run(
            ["bash", str(self.hooks[event])], env=env, capture_output=True, text=True, timeout=60
        )

    def provision(self) -> None:
        self.step("provision")
        values = self.values
        suffix = values.get("RETRAIN_NAME_SUFFIX", "")
        for name, output in main_outputs().items():
            values[name] = "false" if output["type"] == "bool" else f"{name.lower()}-{suffix}"
        self.env_file.write_text(json.dumps(values))

    def up(self, **environ: str) -> subprocess.CompletedProcess[str]:
        pre = self.hook("preprovision", **environ)
        assert pre.returncode == 0, pre.stderr
        self.provision()
        self.step("postprovision")  # `retrain publish`: stubbed, it needs a workspace
        self.step("deploy")
        return self.hook("postdeploy", **environ)

    def down(self) -> subprocess.CompletedProcess[str]:
        self.step("down")
        result = self.hook("postdown")
        assert result.returncode == 0, result.stderr
        return result


@pytest.fixture
def fake_azd(tmp_path: Path) -> FakeAzd:
    return FakeAzd(tmp_path)


# -- no provision inside a hook; the subscriptions after the code -----------------------------------------


def test_azure_yaml_names_the_hooks_and_each_exists():
    hooks = hook_scripts()
    assert {"preprovision", "postdeploy", "postdown"} <= set(hooks)
    for event, script in hooks.items():
        assert script.is_file(), f"azure.yaml: {event} runs {script}, which does not exist"


@pytest.mark.parametrize("event", sorted(hook_scripts()))
def test_no_hook_provisions_or_runs_up(event):
    script = hook_scripts()[event]
    # a command (at a line's start, after ; & | ( or then/do/else), not a message that mentions one
    invocation = re.compile(r"(?:^|[;&|(]|\bthen\b|\bdo\b|\belse\b)\s*azd\s+(?:-\S+\s+)*(provision|up)\b")
    offending = [line for line in command_lines(script) if invocation.search(line)]
    where = script.relative_to(REPO_ROOT)
    assert not offending, f"{where} runs azd provision/up (such hooks may loop): {offending}"


def test_main_bicep_has_no_published_flag_and_no_subscriptions_module():
    parsed = parse(MAIN)
    assert "functionsPublished" not in parsed["parameters"]
    modules = {name: module["detail"]["path"] for name, module in parsed.get("modules", {}).items()}
    assert "modules/subscriptions.bicep" not in modules.values(), modules
    assert "RETRAIN_FUNCTIONS_PUBLISHED" not in (INFRA / "main.parameters.json").read_text()


def postdeploy_parameters() -> dict[str, str]:
    """name=value of the subscriptions deployment's --parameters in the postdeploy hook: value is the
    environment variable it reads."""
    source = "\n".join(command_lines(hook_scripts()["postdeploy"]))
    assert "az deployment group create" in source and "infra/modules/subscriptions.bicep" in source
    return dict(re.findall(r"^\s*(\w+)=\"\$\{?(\w+)", source, re.MULTILINE))


def test_postdeploy_gives_every_required_subscriptions_parameter_a_main_bicep_output():
    declared = parse(SUBSCRIPTIONS)["parameters"]
    required = {name for name, param in declared.items() if param.get("default") is None}
    passed = postdeploy_parameters()
    assert required <= set(passed), f"postdeploy.sh passes no value for {sorted(required - set(passed))}"
    assert set(passed) <= set(declared), f"postdeploy.sh passes unknown {sorted(set(passed) - set(declared))}"
    outputs = main_outputs()
    not_outputs = {name: variable for name, variable in passed.items() if variable not in outputs}
    assert not not_outputs, f"postdeploy.sh reads values main.bicep does not output: {not_outputs}"


# -- teardown and redeploy, simulated -------------------------------------------------------------------


def significant(calls: list[dict[str, Any]]) -> list[str]:
    """The calls that show the order of work."""
    found = []
    for call in calls:
        argv = call["argv"]
        if call["program"] == "step":
            found.append(argv[0])
        elif call["program"] == "az" and argv[:3] == ["deployment", "group", "create"]:
            found.append("az deployment group create")
        elif call["program"] == "az" and argv[:2] == ["vm", "list-skus"]:
            found.append("az vm list-skus")
        elif call["program"] == "azd" and argv[:2] == ["env", "set"]:
            found.append(f"azd env set {argv[-2]}")
    return found


def test_up_names_the_incarnation_then_subscribes_after_the_code(fake_azd):
    result = fake_azd.up()

    assert result.returncode == 0, result.stderr
    assert significant(fake_azd.calls()) == [
        "preprovision",
        "azd env set RETRAIN_NAME_SUFFIX",
        "az vm list-skus",
        "provision",
        "postprovision",
        "deploy",
        "postdeploy",
        "az deployment group create",
    ]
    suffix = fake_azd.values["RETRAIN_NAME_SUFFIX"]
    assert re.fullmatch(r"[a-z]{5}", suffix)
    [deployment] = [c for c in fake_azd.calls() if c["argv"][:3] == ["deployment", "group", "create"]]
    argv = deployment["argv"]
    assert argv[argv.index("--resource-group") + 1] == fake_azd.values["AZURE_RESOURCE_GROUP"]
    template = argv[argv.index("--template-file") + 1]
    assert (Path(deployment["cwd"]) / template).resolve() == SUBSCRIPTIONS
    parameters = dict(word.split("=", 1) for word in argv[argv.index("--parameters") + 1 :])
    assert parameters["functionAppName"] == fake_azd.values["RETRAIN_FUNCTION_APP"]
    assert parameters["deployDriftTopic"] == "false"
    assert not any(c["program"] == "azd" and c["argv"][0] in ("provision", "up") for c in fake_azd.calls())


def test_the_suffix_is_set_once_per_incarnation(fake_azd):
    assert fake_azd.up().returncode == 0
    suffix = fake_azd.values["RETRAIN_NAME_SUFFIX"]

    assert fake_azd.up().returncode == 0  # `azd up` again: the same resources, no new names
    assert fake_azd.values["RETRAIN_NAME_SUFFIX"] == suffix
    sets = [c for c in fake_azd.calls() if c["argv"][:2] == ["env", "set"]]
    assert len(sets) == 1


def test_down_then_up_gets_fresh_names_and_no_published_flag(fake_azd):
    values = fake_azd.values
    values["RETRAIN_FUNCTIONS_PUBLISHED"] = "true"  # left by the postdeploy hook of earlier versions
    fake_azd.env_file.write_text(json.dumps(values))
    assert fake_azd.up().returncode == 0
    first = fake_azd.values["RETRAIN_NAME_SUFFIX"]

    down = fake_azd.down()
    assert fake_azd.values["RETRAIN_NAME_SUFFIX"] == ""
    assert fake_azd.values["RETRAIN_FUNCTIONS_PUBLISHED"] == ""
    assert "RETRAIN_NAME_SUFFIX" in down.stdout

    assert fake_azd.up().returncode == 0
    second = fake_azd.values["RETRAIN_NAME_SUFFIX"]
    assert second and second != first
    assert "RETRAIN_FUNCTIONS_PUBLISHED" not in {
        c["argv"][-2] for c in fake_azd.calls() if c["argv"][:2] == ["env", "set"] and c["argv"][-1]
    }


def test_an_environment_provisioned_before_the_suffix_keeps_its_names(fake_azd):
    values = fake_azd.values
    values["RETRAIN_FUNCTION_APP"] = "func-abc"
    fake_azd.env_file.write_text(json.dumps(values))

    result = fake_azd.hook("preprovision")

    assert result.returncode == 0, result.stderr
    assert "RETRAIN_NAME_SUFFIX" not in fake_azd.values
    assert "without a name suffix" in result.stdout


def test_a_deployment_that_fails_while_roles_propagate_is_retried(fake_azd):
    result = fake_azd.up(FAKE_AZ_FAILURES="2")

    assert result.returncode == 0, result.stderr
    deployments = [c for c in fake_azd.calls() if c["argv"][:3] == ["deployment", "group", "create"]]
    assert len(deployments) == 3
    retries = [line for line in result.stderr.splitlines() if line.startswith("postdeploy:")]
    assert len(retries) == 2 and "try 1 of 6" in retries[0] and "try 2 of 6" in retries[1]


def test_a_deployment_that_keeps_failing_stops_with_one_line(fake_azd):
    result = fake_azd.up(FAKE_AZ_FAILURES="always")

    assert result.returncode != 0
    deployments = [c for c in fake_azd.calls() if c["argv"][:3] == ["deployment", "group", "create"]]
    assert len(deployments) == 6
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("postdeploy:") and "failed 6 times" in last and "azd deploy" in last


def test_a_region_without_the_gpu_size_stops_before_provisioning(fake_azd):
    result = fake_azd.hook("preprovision", FAKE_AZ_SKUS="")

    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert GPU_SIZE in line and "swedencentral" in line and "az vm list-skus" in line
    assert GPU_SIZE in (REPO_ROOT / "components/compute/gpu-dedicated.yml").read_text()


def test_the_hooks_that_set_values_name_the_environment(fake_azd):
    # `azd up -e <env>` runs the hooks for <env>, which need not be the default environment
    fake_azd.up()
    fake_azd.down()
    for call in fake_azd.calls():
        if call["program"] == "azd" and call["argv"][:2] == ["env", "set"]:
            assert call["argv"][2:4] == ["--environment", "dev"], call


# -- names, principals, regions ------------------------------------------------------------------------


def resolved(value: str, variables: dict[str, Any]) -> str:
    """A main.bicep string with its ${variable} interpolations expanded (one level per pass)."""

    def expand(match: re.Match[str]) -> str:
        found = variables.get(match[1], {}).get("value")
        return found if isinstance(found, str) else match[0]

    for _ in range(5):
        value = re.sub(r"\$\{(\w+)\}", expand, value)
    return value


def soft_deleted_names() -> list[tuple[str, str]]:
    """(where, the name main.bicep gives) of each purge-protected key vault and each Azure ML workspace."""
    main = parse(MAIN)
    found = []
    for module_name, module in main["modules"].items():
        path = MAIN.parent / module["detail"]["path"]
        config, _ = body(module)
        for symbol, resource in parse(path).get("resources", {}).items():
            if resource.get("existing"):
                continue
            resource_body, _ = body(resource)
            protected = (resource_body.get("properties") or {}).get("enablePurgeProtection") is True
            if (resource["type"] == "Microsoft.KeyVault/vaults" and protected) or resource[
                "type"
            ] == "Microsoft.MachineLearningServices/workspaces":
                name = text(resource_body["name"])
                value = config["params"].get(name, name)
                found.append((f"{module_name}.{symbol}", resolved(text(value), main["variables"])))
    return found


def test_every_name_that_stays_soft_deleted_includes_the_suffix():
    names = soft_deleted_names()
    assert any(where.endswith("keyVault") for where, _ in names), names
    for where, name in names:
        assert "nameSuffix" in name, f"{where} is named {name!r}: fixed across incarnations"
    suffix = parse(MAIN)["parameters"]["nameSuffix"]
    assert suffix["default"] == ""
    assert {"type": "max_length", "argument": 8} in suffix["decorators"]  # 'kv-' + 13 + 8 = 24
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert parameters["nameSuffix"]["value"].startswith("${RETRAIN_NAME_SUFFIX")


def test_the_deployers_principal_type_comes_from_azd_and_reaches_every_assignment():
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert parameters["principalType"]["value"] == "${AZURE_PRINCIPAL_TYPE=User}"
    main = parse(MAIN)
    declared = main["parameters"]["principalType"]
    assert declared["default"] == "User"
    assert {"type": "allowed", "argument": ["User", "ServicePrincipal"]} in declared["decorators"]
    roles_module, _ = body(main["modules"]["roles"])
    assert roles_module["params"]["principalType"] == "principalType"
    roles = parse(INFRA / "modules" / "roles.bicep")
    deployer = [
        (name, body(resource)[0]["properties"])
        for name, resource in roles["resources"].items()
        if resource["type"] == "Microsoft.Authorization/roleAssignments"
        and text(body(resource)[0]["properties"]["principalId"]) == "principalId"
    ]
    assert deployer
    for name, properties in deployer:
        assert text(properties["principalType"]) == "principalType", f"roles.bicep: {name}"


def test_the_location_is_a_flex_consumption_region_azd_prompts_for():
    declared = parse(MAIN)["parameters"]["location"]
    assert {"type": "allowed", "argument": FLEX_CONSUMPTION_REGIONS} in declared["decorators"]
    assert {"type": "metadata", "argument": {"azd": {"type": "location"}}} in declared["decorators"]
    source = MAIN.read_text()
    assert "list-flexconsumption-locations" in source and "learn.microsoft.com" in source
