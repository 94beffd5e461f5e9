"""Storage settings: the landing account's endpoint, container, prefix and suffixes, the ledger's location,
and the emulator's connection string, each validated into a frozen value (function_app/settings/app.py reads
them from the environment).

An endpoint is `https://<account>.blob.<Azure cloud suffix>` or Azurite's path-style
`http://127.0.0.1:<port>/<account>`. The connection string is for Azurite only: in Azure the managed
identity is used. It carries the account key, so no message ever quotes it, and `mask_secrets` scrubs keys,
SAS tokens, signatures and URL user info from any text that could hold one. The URL, name and prefix rules
are core/blob_urls.py's, shared with the ledger and the checkpoint store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from components.data_version import MAX_RAW_DEPTH, RAW_SUFFIXES
from core.blob_urls import (
    EMULATOR_HOSTS,
    AccountEndpoint,
    check_account_name,
    check_container_name,
    check_prefix,
    parse_account_endpoint,
    parse_blob_url,
)
from core.errors import RetrainError
from core.secrets import displayable_url
from core.text import quoted

BLOB_ACCOUNT, BLOB_CONTAINER, BLOB_PREFIX = (
    "RETRAIN_BLOB_ACCOUNT",
    "RETRAIN_BLOB_CONTAINER",
    "RETRAIN_BLOB_PREFIX",
)
BLOB_SUFFIXES, BLOB_ENDPOINT = "RETRAIN_BLOB_SUFFIXES", "RETRAIN_BLOB_ENDPOINT"
LEDGER = "RETRAIN_LEDGER"
STORAGE_CONNECTION_STRING = "RETRAIN_STORAGE_CONNECTION_STRING"

# A file suffix a scope may name: any task's raw files (a built-in's, or a user's task's own), not only the
# tabular task's. The same rule as a model configuration's [trigger] suffixes (components/model_config.py).
_SUFFIX = re.compile(r"\.[a-z0-9]{1,10}")
SUFFIX_FORM = "a dot and 1-10 lowercase letters or digits, such as .csv or .png"

# Azurite's well-known development account, what 'UseDevelopmentStorage=true' means.
DEVELOPMENT_ACCOUNT, DEVELOPMENT_ENDPOINT = "devstoreaccount1", "http://127.0.0.1:10000/devstoreaccount1"
EXPECTED_CONNECTION_STRING = (
    "'DefaultEndpointsProtocol=http;AccountName=<account>;AccountKey=<key>;"
    "BlobEndpoint=http://127.0.0.1:<port>/<account>;' or 'UseDevelopmentStorage=true'"
)


class SettingsError(RetrainError, ValueError):
    """An app setting is missing or malformed; the message names it and the expected form. Still a
    ValueError, which callers reading settings catch."""

    one_line = False  # kept as written


@dataclass(frozen=True)
class BlobScope:
    """Which blobs belong to one model: one container of one account, names at most `depth` levels below a
    prefix (1: directly under it, a tabular task's batches; 2: also in one level of sub-folders, the image
    task's class folders), with one of the suffixes (its task's raw files). A data version pins exactly
    those, each named by its path below the prefix (`circle/a.png`)."""

    endpoint: AccountEndpoint
    container: str
    prefix: str = ""
    suffixes: tuple[str, ...] = RAW_SUFFIXES
    depth: int = 1

    def __post_init__(self) -> None:
        check_container_name(self.container, BLOB_CONTAINER, SettingsError)
        object.__setattr__(self, "prefix", check_prefix(self.prefix, BLOB_PREFIX, SettingsError))
        bad = [suffix for suffix in self.suffixes if not _SUFFIX.fullmatch(suffix)]
        if not self.suffixes or bad:
            raise SettingsError(
                f"{BLOB_SUFFIXES} {quoted(','.join(self.suffixes))}: expected comma-separated file suffixes, "
                f"each {SUFFIX_FORM} (the raw files a data version pins)"
            )
        depth = self.depth
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_RAW_DEPTH:
            raise SettingsError(
                f"blob scope depth {self.depth!r}: expected a whole number from 1 (files directly under the "
                f"prefix) to {MAX_RAW_DEPTH} (folder levels below it)"
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

    @property
    def pattern(self) -> str:
        """The scope for messages: 'https://.../landing/shapes/*/*{.png,.jpg}' (one '*/' per class level)."""
        return f"{self.container_url}/{self.folder}{'*/' * (self.depth - 1)}*{{{','.join(self.suffixes)}}}"


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
        if self.endpoint is not None:
            check_container_name(self.container or "", f"{LEDGER} container", SettingsError)
        object.__setattr__(self, "prefix", check_prefix(self.prefix, f"{LEDGER} prefix", SettingsError))

    @property
    def spec(self) -> str:
        """The location as function_app/ledger/'s `open_ledger` takes it: the folder, or the URL."""
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
                f"{LEDGER} {quoted(displayable_url(text), 120)}: scheme {quoted(scheme)} is not supported; "
                "expected a folder or an https blob container URL"
            )
        if not scheme:
            if "\x00" in text:
                raise SettingsError(f"{LEDGER}: a folder path cannot contain NUL; expected a folder or URL")
            return cls(folder=Path(text))
        location = parse_blob_url(text, LEDGER, SettingsError)
        return cls(endpoint=location.endpoint, container=location.container, prefix=location.prefix)


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
        if any(mark in blob_endpoint for mark in "@?#"):
            # Not quoted: the user info, SAS or fragment is a credential (and may hold '/' or '?').
            raise SettingsError(
                f"{STORAGE_CONNECTION_STRING} BlobEndpoint carries credentials (user info, a query or a "
                "fragment); expected the emulator's plain endpoint, the key in AccountKey"
            )
        host = (urlsplit(blob_endpoint).hostname or "") if "://" in blob_endpoint else ""
        if host not in EMULATOR_HOSTS:
            raise SettingsError(
                f"{STORAGE_CONNECTION_STRING} points at {quoted(host or 'no host')}, which is not the "
                "emulator; it is for Azurite only (in Azure, unset it: the managed identity is used)"
            )
        account = check_account_name(account, f"{STORAGE_CONNECTION_STRING} AccountName", SettingsError)
        return cls(account, blob_endpoint)


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
    check_account_name(account, BLOB_ACCOUNT, SettingsError)
    configured = configured_endpoint(values)
    if configured is not None and configured.account != account:
        raise SettingsError(
            f"{BLOB_ENDPOINT} {quoted(values[BLOB_ENDPOINT])}: is not the endpoint of account {account!r}; "
            f"expected https://{account}.blob.core.windows.net or http://127.0.0.1:<port>/{account}"
        )
    suffixes = values.get(BLOB_SUFFIXES, ",".join(RAW_SUFFIXES))
    return BlobScope(
        endpoint=account_endpoint(account, values),
        container=container,
        prefix=values.get(BLOB_PREFIX, ""),
        suffixes=tuple(suffix.strip() for suffix in suffixes.split(",") if suffix.strip()),
    )


def account_endpoint(account: str, values: Mapping[str, str]) -> AccountEndpoint:
    """The endpoint of storage account `account`: RETRAIN_BLOB_ENDPOINT when that is this account's (Azurite,
    or another Azure cloud), else `https://<account>.blob.core.windows.net`."""
    configured = configured_endpoint(values)
    if configured is not None and configured.account == account:
        return configured
    check_account_name(account, BLOB_ACCOUNT, SettingsError)
    endpoint, _ = parse_account_endpoint(
        f"https://{account}.blob.core.windows.net", BLOB_ACCOUNT, SettingsError
    )
    return endpoint


def configured_endpoint(values: Mapping[str, str]) -> AccountEndpoint | None:
    """RETRAIN_BLOB_ENDPOINT checked (an account's endpoint and nothing after it), or None when unset."""
    text = values.get(BLOB_ENDPOINT)
    if text is None:
        return None
    endpoint, rest = parse_account_endpoint(text.rstrip("/"), BLOB_ENDPOINT, SettingsError)
    if rest:
        raise SettingsError(
            f"{BLOB_ENDPOINT} {quoted(text)}: has a path after the account; expected "
            "https://<account>.blob.core.windows.net or http://127.0.0.1:<port>/<account>"
        )
    return endpoint
