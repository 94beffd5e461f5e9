"""Storage settings: the landing account's endpoint, container, prefix and suffixes, the ledger's location,
and the emulator's connection string, each validated into a frozen value (function_app/settings.py reads
them from the environment).

An endpoint is `https://<account>.blob.<Azure cloud suffix>` or Azurite's path-style
`http://127.0.0.1:<port>/<account>`. The connection string is for Azurite only: in Azure the managed
identity is used. It carries the account key, so no message ever quotes it, and `mask_secrets` scrubs keys,
SAS tokens and signatures from any text that could hold one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from components.data_version import RAW_SUFFIXES

BLOB_ACCOUNT, BLOB_CONTAINER, BLOB_PREFIX = (
    "RETRAIN_BLOB_ACCOUNT",
    "RETRAIN_BLOB_CONTAINER",
    "RETRAIN_BLOB_PREFIX",
)
BLOB_SUFFIXES, BLOB_ENDPOINT = "RETRAIN_BLOB_SUFFIXES", "RETRAIN_BLOB_ENDPOINT"
LEDGER = "RETRAIN_LEDGER"
STORAGE_CONNECTION_STRING = "RETRAIN_STORAGE_CONNECTION_STRING"

EMULATOR_HOSTS = frozenset({"127.0.0.1", "localhost"})
# Azurite's well-known development account, what 'UseDevelopmentStorage=true' means.
DEVELOPMENT_ACCOUNT, DEVELOPMENT_ENDPOINT = "devstoreaccount1", "http://127.0.0.1:10000/devstoreaccount1"
CLOUD_SUFFIXES = ("core.windows.net", "core.chinacloudapi.cn", "core.usgovcloudapi.net")

_ACCOUNT_NAME = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER_NAME = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]*")
_MAX_PREFIX_CHARS = 800  # a blob name has at most 1024 characters: leave room for the file's own name
_SECRET_PATTERNS = (
    re.compile(r"(?i)(AccountKey=)[^;\s'\"]+"),
    re.compile(r"(?i)(SharedAccessSignature=)[^;\s'\"]+"),
    re.compile(r"(?i)(\bsig=)[^&;\s'\"]+"),
    re.compile(r"(?i)(\bSharedKey(?:Lite)?\s+[^:\s]+:)[^\s'\"]+"),
)
_EXPECTED_ENDPOINT = (
    "https://<account>.blob.core.windows.net (or another Azure cloud's blob host), "
    "or http://127.0.0.1:<port>/<account> for the Azurite emulator"
)
EXPECTED_CONNECTION_STRING = (
    "'DefaultEndpointsProtocol=http;AccountName=<account>;AccountKey=<key>;"
    "BlobEndpoint=http://127.0.0.1:<port>/<account>;' or 'UseDevelopmentStorage=true'"
)


class SettingsError(ValueError):
    """An app setting is missing or malformed; the message names it and the expected form."""


def quoted(value: object, limit: int = 80) -> str:
    """A setting's value for an error message: masked, clipped, and one line (repr escapes breaks)."""
    text = mask_secrets(str(value))
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def mask_secrets(text: str) -> str:
    """`text` with account keys, SAS tokens and signatures replaced by '***'."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(r"\1***", text)
    return text


@dataclass(frozen=True)
class AccountEndpoint:
    """A storage account's blob endpoint: `https://<account>.blob.<cloud suffix>` or Azurite's path-style
    `http://127.0.0.1:<port>/<account>` (the account is the first path segment there)."""

    account: str
    url: str  # without a trailing '/'
    is_emulator: bool

    @property
    def dfs_url(self) -> str | None:
        """The account's Data Lake endpoint, which FlushWithClose events name; the emulator has none."""
        return None if self.is_emulator else self.url.replace(".blob.", ".dfs.", 1)


def parse_endpoint(url: str, setting: str) -> tuple[AccountEndpoint, list[str]]:
    """The account endpoint `url` starts with, and the path segments after it; `setting` names the URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _bad_endpoint(url, setting, "it cannot be parsed") from None
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise _bad_endpoint(url, setting, "credentials or queries do not belong in it")
    host = parts.hostname or ""
    segments = [segment for segment in parts.path.split("/") if segment]
    cloud = _cloud_account(host)
    if cloud and parts.scheme == "https" and port in (None, 443):
        return AccountEndpoint(cloud, f"https://{host}", is_emulator=False), segments
    if host in EMULATOR_HOSTS and parts.scheme in ("http", "https") and segments:
        account = segments.pop(0)
        netloc = f"{host}:{port}" if port else host
        _check_account(account, setting)
        return AccountEndpoint(account, f"{parts.scheme}://{netloc}/{account}", is_emulator=True), segments
    raise _bad_endpoint(
        url, setting, "the host is neither an Azure Blob Storage account over https nor Azurite"
    )


def _cloud_account(host: str) -> str | None:
    account, _, rest = host.partition(".blob.")
    if rest in CLOUD_SUFFIXES and _ACCOUNT_NAME.fullmatch(account):
        return account
    return None


def _bad_endpoint(url: str, setting: str, why: str) -> SettingsError:
    shown = mask_secrets(url.split("?", 1)[0].split("#", 1)[0])
    return SettingsError(f"{setting} {quoted(shown)}: {why}; expected {_EXPECTED_ENDPOINT}")


def _check_account(account: str, setting: str) -> str:
    if not _ACCOUNT_NAME.fullmatch(account):
        raise SettingsError(
            f"{setting} {quoted(account)}: expected a storage account name of 3-24 lowercase letters or "
            "digits"
        )
    return account


def check_prefix(prefix: str, setting: str) -> str:
    """A folder inside a container, without leading or trailing '/'; '' is the container's root."""
    trimmed = prefix.removesuffix("/")
    segments = trimmed.split("/") if trimmed else []
    if len(trimmed) > _MAX_PREFIX_CHARS or not all(_PREFIX_SEGMENT.fullmatch(s) for s in segments):
        raise SettingsError(
            f"{setting} {quoted(prefix)}: expected folder names of letters, digits, '.', '_', '=' or "
            f"'-' separated by single '/' (no leading '/', no '..'), at most {_MAX_PREFIX_CHARS} characters"
        )
    return trimmed


@dataclass(frozen=True)
class BlobScope:
    """Which blobs belong to this front door: one container of one account, names directly under a prefix
    (the data version pins a prefix's direct children only), with one of the suffixes."""

    endpoint: AccountEndpoint
    container: str
    prefix: str = ""
    suffixes: tuple[str, ...] = RAW_SUFFIXES

    def __post_init__(self) -> None:
        if not _CONTAINER_NAME.fullmatch(self.container):
            raise SettingsError(
                f"{BLOB_CONTAINER} {quoted(self.container)}: expected a container name of 3-63 lowercase "
                "letters, digits or single '-', starting and ending with a letter or digit"
            )
        object.__setattr__(self, "prefix", check_prefix(self.prefix, BLOB_PREFIX))
        unknown = [suffix for suffix in self.suffixes if suffix not in RAW_SUFFIXES]
        if not self.suffixes or unknown:
            raise SettingsError(
                f"{BLOB_SUFFIXES} {quoted(','.join(self.suffixes))}: expected a comma-separated subset of "
                f"{','.join(RAW_SUFFIXES)} (the files a data version pins)"
            )

    @property
    def account(self) -> str:
        return self.endpoint.account

    @property
    def folder(self) -> str:
        """The prefix as a folder ('digits/'), '' for the container's root."""
        return f"{self.prefix}/" if self.prefix else ""

    @property
    def container_url(self) -> str:
        return f"{self.endpoint.url}/{self.container}"


@dataclass(frozen=True)
class LedgerLocation:
    """Where the ledger lives: a local folder, or a container (and prefix) in Blob Storage."""

    folder: Path | None = None
    endpoint: AccountEndpoint | None = None
    container: str | None = None
    prefix: str = ""

    def __post_init__(self) -> None:
        if (self.folder is None) == (self.endpoint is None):
            raise SettingsError(f"{LEDGER}: expected either a folder or a blob container URL")
        if self.endpoint is not None and not _CONTAINER_NAME.fullmatch(self.container or ""):
            raise SettingsError(
                f"{LEDGER} {self.endpoint.url}/{self.container or ''}: expected a container name of 3-63 "
                "lowercase letters, digits or '-' after the account"
            )
        object.__setattr__(self, "prefix", check_prefix(self.prefix, LEDGER))

    @property
    def spec(self) -> str:
        """The location as function_app/ledger.py's `open_ledger` takes it: the folder, or the URL."""
        return self.url or str(self.folder)

    @property
    def url(self) -> str | None:
        if self.endpoint is None:
            return None
        container_url = f"{self.endpoint.url}/{self.container}"
        return f"{container_url}/{self.prefix}" if self.prefix else container_url

    @classmethod
    def parse(cls, text: str) -> LedgerLocation:
        """A folder path, or `https://<account>.blob.core.windows.net/<container>[/<prefix>]`."""
        scheme = text.split("://", 1)[0].lower() if "://" in text else ""
        if scheme not in ("", "http", "https"):
            raise SettingsError(
                f"{LEDGER} {quoted(text.split('?', 1)[0])}: scheme {quoted(scheme)} is not supported; "
                "expected a folder or an https blob container URL"
            )
        if not scheme:
            if "\x00" in text:
                raise SettingsError(f"{LEDGER}: a folder path cannot contain NUL; expected a folder or URL")
            return cls(folder=Path(text))
        endpoint, segments = parse_endpoint(text, LEDGER)
        if not segments:
            raise SettingsError(
                f"{LEDGER} {endpoint.url}: names no container; expected {endpoint.url}/<container>[/<prefix>]"
            )
        return cls(endpoint=endpoint, container=segments[0], prefix="/".join(segments[1:]))


@dataclass(frozen=True)
class EmulatorConnection:
    """The parts of an Azurite connection string that must agree with the other settings."""

    account: str
    blob_endpoint: str

    @classmethod
    def parse(cls, text: str) -> EmulatorConnection:
        # Never quote `text`: it carries the account key.
        pairs = {}
        for item in filter(None, (piece.strip() for piece in text.split(";"))):
            key, equals, value = item.partition("=")
            if not equals or not key.strip():
                raise SettingsError(
                    f"{STORAGE_CONNECTION_STRING} is malformed (a part without '='); expected "
                    f"{EXPECTED_CONNECTION_STRING}"
                )
            pairs[key.strip().lower()] = value.strip()
        if pairs.get("usedevelopmentstorage", "").lower() == "true":
            return cls(DEVELOPMENT_ACCOUNT, DEVELOPMENT_ENDPOINT)
        account, blob_endpoint = pairs.get("accountname", ""), pairs.get("blobendpoint", "").rstrip("/")
        if not account or not blob_endpoint or not pairs.get("accountkey"):
            raise SettingsError(
                f"{STORAGE_CONNECTION_STRING} lacks AccountName, AccountKey or BlobEndpoint; expected "
                f"{EXPECTED_CONNECTION_STRING}"
            )
        host = (urlsplit(blob_endpoint).hostname or "") if "://" in blob_endpoint else ""
        if host not in EMULATOR_HOSTS:
            raise SettingsError(
                f"{STORAGE_CONNECTION_STRING} points at {quoted(host or 'no host')}, which is not the "
                "emulator; it is for Azurite only (in Azure, unset it: the managed identity is used)"
            )
        return cls(_check_account(account, f"{STORAGE_CONNECTION_STRING} AccountName"), blob_endpoint)


def blob_scope_from(values: Mapping[str, str]) -> BlobScope | None:
    """The landing blobs the RETRAIN_BLOB_* variables name, or None when none are set."""
    account, container = values.get(BLOB_ACCOUNT), values.get(BLOB_CONTAINER)
    if account is None and container is None:
        others = [name for name in (BLOB_PREFIX, BLOB_SUFFIXES, BLOB_ENDPOINT) if name in values]
        if others:
            raise SettingsError(
                f"{others[0]} is set but {BLOB_ACCOUNT} and {BLOB_CONTAINER} are not; expected all three"
            )
        return None
    if account is None or container is None:
        missing = BLOB_ACCOUNT if account is None else BLOB_CONTAINER
        raise SettingsError(f"{missing} is unset; expected it with {BLOB_ACCOUNT} and {BLOB_CONTAINER}")
    _check_account(account, BLOB_ACCOUNT)
    endpoint_text = values.get(BLOB_ENDPOINT, f"https://{account}.blob.core.windows.net")
    endpoint, rest = parse_endpoint(endpoint_text.rstrip("/"), BLOB_ENDPOINT)
    if rest or endpoint.account != account:
        raise SettingsError(
            f"{BLOB_ENDPOINT} {quoted(endpoint_text)}: is not the endpoint of account {account!r}; expected "
            f"https://{account}.blob.core.windows.net or http://127.0.0.1:<port>/{account}"
        )
    suffixes = values.get(BLOB_SUFFIXES, ",".join(RAW_SUFFIXES))
    return BlobScope(
        endpoint=endpoint,
        container=container,
        prefix=values.get(BLOB_PREFIX, ""),
        suffixes=tuple(suffix.strip() for suffix in suffixes.split(",") if suffix.strip()),
    )
