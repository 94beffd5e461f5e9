"""Microsoft's REST models of a resource's PUT body, read from the azure-mgmt-* packages.

The packages are generated from the same REST specifications as Bicep's resource types. Two generations of
generator are in use, and both are read here into one shape (`ObjectSchema`):
- msrest models: `_attribute_map` ({attr: {"key": "properties.publicAccess", "type": "[Foo]"}}), where a
  dotted key is a property flattened out of a nested object, `_validation` for read-only fields and
  `_subtype_map` for polymorphic types;
- `model_base` models: `rest_field(name=..., visibility=[...])` class attributes typed by annotations, with
  `__mapping__` and a `rest_discriminator` field for polymorphic types.
A package generated for one API version models that version only; multi-API packages ship a `vYYYY_MM_DD`
sub-package per version.
"""

from __future__ import annotations

import datetime
import enum
import functools
import importlib
import importlib.util
import pkgutil
import re
import types
import typing
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

# Resource type (case-insensitive, as ARM treats it) -> (distribution, import package, PUT body model).
# The ML models are azure-ai-ml's own generated ARM client (Microsoft.MachineLearningServices): the last
# azure-mgmt-machinelearningservices models API 2020-08-01, before datastores were ARM resources.
_ML = ("azure-ai-ml", "azure.ai.ml._restclient.arm_ml_service")
RESOURCE_MODELS: dict[str, tuple[str, str, str]] = {
    "Microsoft.Storage/storageAccounts": (
        "azure-mgmt-storage",
        "azure.mgmt.storage",
        "StorageAccountCreateParameters",
    ),
    "Microsoft.Storage/storageAccounts/blobServices": (
        "azure-mgmt-storage",
        "azure.mgmt.storage",
        "BlobServiceProperties",
    ),
    "Microsoft.Storage/storageAccounts/blobServices/containers": (
        "azure-mgmt-storage",
        "azure.mgmt.storage",
        "BlobContainer",
    ),
    "Microsoft.Storage/storageAccounts/queueServices": (
        "azure-mgmt-storage",
        "azure.mgmt.storage",
        "QueueServiceProperties",
    ),
    "Microsoft.Storage/storageAccounts/queueServices/queues": (
        "azure-mgmt-storage",
        "azure.mgmt.storage",
        "StorageQueue",
    ),
    "Microsoft.Storage/storageAccounts/managementPolicies": (
        "azure-mgmt-storage",
        "azure.mgmt.storage",
        "ManagementPolicy",
    ),
    "Microsoft.Web/sites": ("azure-mgmt-web", "azure.mgmt.web", "Site"),
    "Microsoft.Web/serverfarms": ("azure-mgmt-web", "azure.mgmt.web", "AppServicePlan"),
    "Microsoft.EventGrid/systemTopics": ("azure-mgmt-eventgrid", "azure.mgmt.eventgrid", "SystemTopic"),
    "Microsoft.EventGrid/systemTopics/eventSubscriptions": (
        "azure-mgmt-eventgrid",
        "azure.mgmt.eventgrid",
        "EventSubscription",
    ),
    "Microsoft.EventGrid/topics": ("azure-mgmt-eventgrid", "azure.mgmt.eventgrid", "Topic"),
    "Microsoft.EventGrid/topics/eventSubscriptions": (
        "azure-mgmt-eventgrid",
        "azure.mgmt.eventgrid",
        "EventSubscription",
    ),
    "Microsoft.MachineLearningServices/workspaces": (*_ML, "Workspace"),
    "Microsoft.MachineLearningServices/workspaces/computes": (*_ML, "ComputeResource"),
    "Microsoft.MachineLearningServices/workspaces/datastores": (*_ML, "Datastore"),
    "Microsoft.Authorization/roleAssignments": (
        "azure-mgmt-authorization",
        "azure.mgmt.authorization",
        "RoleAssignmentCreateParameters",
    ),
    "Microsoft.Authorization/roleDefinitions": (
        "azure-mgmt-authorization",
        "azure.mgmt.authorization",
        "RoleDefinition",
    ),
    "Microsoft.Insights/components": (
        "azure-mgmt-applicationinsights",
        "azure.mgmt.applicationinsights",
        "ApplicationInsightsComponent",
    ),
    "Microsoft.OperationalInsights/workspaces": (
        "azure-mgmt-loganalytics",
        "azure.mgmt.loganalytics",
        "Workspace",
    ),
    "Microsoft.ManagedIdentity/userAssignedIdentities": ("azure-mgmt-msi", "azure.mgmt.msi", "Identity"),
    "Microsoft.Resources/resourceGroups": (
        "azure-mgmt-resource",
        "azure.mgmt.resource.resources",
        "ResourceGroup",
    ),
    "Microsoft.KeyVault/vaults": (
        "azure-mgmt-keyvault",
        "azure.mgmt.keyvault",
        "VaultCreateOrUpdateParameters",
    ),
}
_BY_LOWER_TYPE = {key.lower(): value for key, value in RESOURCE_MODELS.items()}


class UnmodelledResource(Exception):
    """A resource type, or a type's API version, that no pinned package models."""


# --- the normalised schema -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scalar:
    kind: str  # "str", "int", "float", "bool"; "any" accepts every JSON value


@dataclass(frozen=True)
class ListOf:
    item: Schema


@dataclass(frozen=True)
class DictOf:
    value: Schema


@dataclass(frozen=True)
class Field:
    schema: Schema
    read_only: bool


@dataclass(eq=False)
class ObjectSchema:
    """One REST object. `subtypes` maps a discriminator value to the variant's schema (a thunk, since
    polymorphic hierarchies refer to themselves)."""

    name: str
    fields: dict[str, Field] = field(default_factory=dict)
    discriminator: str | None = None
    subtypes: dict[str, typing.Callable[[], ObjectSchema]] = field(default_factory=dict)
    open: bool = False  # additional properties allowed


Schema = Scalar | ListOf | DictOf | ObjectSchema | typing.Callable[[], ObjectSchema]


def resolve(schema: Schema) -> Scalar | ListOf | DictOf | ObjectSchema:
    return schema() if callable(schema) and not isinstance(schema, ObjectSchema) else schema


# --- looking up a resource type at an API version ----------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    distribution: str
    version: str  # the distribution's version
    api_versions: tuple[str, ...]
    body_model: str


def model_for(resource_type: str, api_version: str) -> ObjectSchema:
    """The PUT body's schema, or UnmodelledResource saying which type or API version to use instead."""
    entry = _BY_LOWER_TYPE.get(resource_type.lower())
    if entry is None:
        known = ", ".join(sorted(RESOURCE_MODELS))
        raise UnmodelledResource(
            f"resource type {resource_type} has no REST model here; the modelled types are: {known} "
            "(add it to RESOURCE_MODELS in tests/helpers/infra/arm_models.py with its azure-mgmt package)"
        )
    distribution, package, body_model = entry
    modules = _models_by_api_version(package)
    candidates = {v: m for v, m in modules.items() if hasattr(m, body_model)}
    if api_version not in candidates:
        offered = ", ".join(sorted(candidates)) or "none"
        raise UnmodelledResource(
            f"{resource_type}@{api_version}: use API version {_newest(candidates)}, the one "
            f"{distribution} {metadata.version(distribution)} models (it models {body_model} at: {offered})"
        )
    return _object_schema(getattr(candidates[api_version], body_model))


def _newest(versions: typing.Iterable[str]) -> str:
    stable = [v for v in versions if not v.endswith("-preview")]
    return max(stable or versions, default="none")


@functools.cache
def _models_by_api_version(package: str) -> dict[str, types.ModuleType]:
    """{api_version: models module}: the package's own, and each `vYYYY_MM_DD` sub-package's."""
    root = importlib.import_module(package)
    found: dict[str, types.ModuleType] = {}
    for info in pkgutil.iter_modules(root.__path__):
        if re.fullmatch(r"v\d{4}_\d{2}(_\d{2})?(_preview)?", info.name):
            sub = f"{package}.{info.name}"
            found[_api_version_of(sub)] = importlib.import_module(f"{sub}.models")
    if not found:
        found[_api_version_of(package)] = importlib.import_module(f"{package}.models")
    return found


def _api_version_of(package: str) -> str:
    # Every generated client's configuration defaults `api_version` to the version it was generated for.
    spec = importlib.util.find_spec(f"{package}._configuration")
    if spec is None or spec.origin is None:
        raise UnmodelledResource(f"{package} has no _configuration module to read its API version from")
    source = Path(spec.origin).read_text(encoding="utf-8")
    match = re.search(r'kwargs\.pop\(\s*"api_version",\s*"([^"]+)"', source)
    if match is None:
        raise UnmodelledResource(f"{spec.origin} does not say which API version it was generated for")
    return match.group(1)


# --- reading a model class into ObjectSchema ---------------------------------------------------------------


@functools.cache
def _object_schema(cls: type) -> ObjectSchema:
    if _is_model_base(cls):
        return _model_base_schema(cls)
    return _msrest_schema(cls)


def _is_model_base(cls: type) -> bool:
    return any(_is_rest_field(v) for klass in cls.__mro__ for v in vars(klass).values())


def _is_rest_field(value: Any) -> bool:
    return hasattr(value, "_rest_name_input") and hasattr(value, "_visibility")


# msrest


_MSREST_SCALARS = {
    "str": "str",
    "int": "int",
    "long": "int",
    "float": "float",
    "decimal": "float",
    "bool": "bool",
    "object": "any",
    "iso-8601": "str",
    "rfc-1123": "str",
    "duration": "str",
    "date": "str",
    "time": "str",
    "unix-time": "int",
    "bytearray": "str",
    "base64": "str",
}


def _msrest_schema(cls: type) -> ObjectSchema:
    models = importlib.import_module(cls.__module__.rsplit(".", 1)[0])
    validation = getattr(cls, "_validation", {})
    schema = ObjectSchema(name=cls.__name__)
    for attr, spec in cls._attribute_map.items():
        key, type_name = spec["key"], spec["type"]
        if key == "":  # additional_properties
            schema.open = True
            continue
        # a dotted key is a property flattened out of nested objects ("properties.publicAccess"); "\\." is
        # a literal dot in a property name
        parts = [p.replace("\\.", ".") for p in re.split(r"(?<!\\)\.", key)]
        target = schema
        for part in parts[:-1]:
            nested = target.fields.get(part)
            if nested is None or not isinstance(nested.schema, ObjectSchema):
                nested = Field(ObjectSchema(name=f"{cls.__name__}.{part}"), read_only=False)
                target.fields[part] = nested
            target = nested.schema
        read_only = bool(validation.get(attr, {}).get("readonly"))
        target.fields[parts[-1]] = Field(_msrest_type(type_name, models), read_only)
    # a flattened parent whose every child is read-only is itself read-only
    for name, fld in list(schema.fields.items()):
        if isinstance(fld.schema, ObjectSchema) and fld.schema.name.startswith(f"{cls.__name__}."):
            inner = fld.schema.fields.values()
            schema.fields[name] = Field(fld.schema, read_only=all(f.read_only for f in inner))
    subtype_map = getattr(cls, "_subtype_map", None) or {}
    for attr, mapping in subtype_map.items():
        if cls.__dict__.get("_subtype_map") is None:
            break  # inherited from the base: this class is one variant, not the base
        schema.discriminator = cls._attribute_map[attr]["key"]
        schema.subtypes = {
            value: functools.partial(_object_schema, getattr(models, class_name))
            for value, class_name in mapping.items()
            if hasattr(models, class_name)
        }
    return schema


def _msrest_type(type_name: str, models: types.ModuleType) -> Schema:
    if type_name.startswith("[") and type_name.endswith("]"):
        return ListOf(_msrest_type(type_name[1:-1], models))
    if type_name.startswith("{") and type_name.endswith("}"):
        return DictOf(_msrest_type(type_name[1:-1], models))
    if type_name in _MSREST_SCALARS:
        return Scalar(_MSREST_SCALARS[type_name])
    model = getattr(models, type_name, None)
    if isinstance(model, type) and issubclass(model, enum.Enum):
        return Scalar("str")
    if model is None:
        return Scalar("any")
    return functools.partial(_object_schema, model)


# model_base


def _model_base_schema(cls: type) -> ObjectSchema:
    models = importlib.import_module(cls.__module__.rsplit(".", 1)[0])
    hints = typing.get_type_hints(cls, localns={"_models": models})
    schema = ObjectSchema(name=cls.__name__)
    for klass in reversed(cls.__mro__):
        for attr, rf in vars(klass).items():
            if attr.startswith("_") or not _is_rest_field(rf):
                continue
            rest_name = rf._rest_name_input or attr
            read_only = list(rf._visibility or []) == ["read"]
            schema.fields[rest_name] = Field(_annotation_schema(hints.get(attr, Any)), read_only)
            if rf._is_discriminator and "__mapping__" in cls.__dict__:
                schema.discriminator = rest_name
    if schema.discriminator is not None:
        schema.subtypes = {
            str(getattr(value, "value", value)): functools.partial(_object_schema, sub)
            for value, sub in cls.__dict__["__mapping__"].items()
        }
    return schema


def _annotation_schema(annotation: Any) -> Schema:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        # Optional[X], or Union[str, SomeEnum] for an open enum
        inner = [_annotation_schema(a) for a in args]
        structured = [s for s in inner if not isinstance(s, Scalar)]
        return structured[0] if structured else inner[0]
    if origin is list:
        return ListOf(_annotation_schema(args[0]) if args else Scalar("any"))
    if origin is dict:
        return DictOf(_annotation_schema(args[1]) if len(args) == 2 else Scalar("any"))
    if origin is typing.Literal:
        return Scalar("str")
    if annotation in (str, bytes, datetime.datetime, datetime.date, datetime.time, datetime.timedelta):
        return Scalar("str")
    if annotation is bool:
        return Scalar("bool")
    if annotation is int:
        return Scalar("int")
    if annotation is float:
        return Scalar("float")
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return Scalar("str")
    if isinstance(annotation, type) and _is_model_base(annotation):
        return functools.partial(_object_schema, annotation)
    return Scalar("any")
