"""Blob URL parsing and its rules (account, container, prefix): every room that names a Blob location
parses it here. Parsers take the name of the setting or option they read, so that each message names what
the user typed where they typed it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from core.errors import InputError
from core.secrets import displayable_url
from core.text import quoted

ErrorType = Callable[[str], Exception]

EMULATOR_HOSTS = frozenset({"127.0.0.1", "localhost"})
CLOUD_SUFFIXES = ("core.windows.net", "core.chinacloudapi.cn", "core.usgovcloudapi.net")
# A blob name has at most 1024 characters: leave room for a record's folder and a 200-character name.
MAX_PREFIX_CHARS = 700
EXPECTED_ENDPOINT = (
    "https://<account>.blob.core.windows.net (or another Azure cloud's blob host), "
    "or http://127.0.0.1:<port>/<account> for the Azurite emulator"
)
EXPECTED_BLOB_URL = (
    "https://<account>.blob.core.windows.net/<container>/<prefix> (the prefix may be empty; or another "
    "Azure cloud's blob host; or http://127.0.0.1:<port>/<account>/<container>/<prefix> for the Azurite "
    "emulator)"
)
PREFIX_RULE = (
    "folder names of letters, digits, '.', '_', '=' or '-' separated by single '/' (no leading '/', "
    f"no '..'), at most 255 characters each and {MAX_PREFIX_CHARS} in all"
)
_ACCOUNT_NAME = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER_NAME = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,254}")
_ACCOUNT_RULE = "3-24 lowercase letters or digits"
_CONTAINER_RULE = "3-63 lowercase letters, digits or single '-', starting and ending with a letter or digit"


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


@dataclass(frozen=True)
class BlobLocation:
    """A folder in Blob Storage: an account's endpoint, a container, and a prefix ('' is the root)."""

    endpoint: AccountEndpoint
    container: str
    prefix: str

    @property
    def container_url(self) -> str:
        return f"{self.endpoint.url}/{self.container}"

    @property
    def url(self) -> str:
        return f"{self.container_url}/{self.prefix}" if self.prefix else self.container_url


def check_account_name(name: str, setting: str, error: ErrorType = InputError) -> str:
    if not _ACCOUNT_NAME.fullmatch(name):
        raise error(f"{setting} {quoted(name)}: expected a storage account name of {_ACCOUNT_RULE}")
    return name


def check_container_name(name: str, setting: str, error: ErrorType = InputError) -> str:
    if not _CONTAINER_NAME.fullmatch(name):
        raise error(f"{setting} {quoted(name)}: expected a container name of {_CONTAINER_RULE}")
    return name


def check_prefix(prefix: str, setting: str, error: ErrorType = InputError) -> str:
    """A folder inside a container, without a trailing '/'; '' is the container's root."""
    trimmed = prefix.removesuffix("/")
    segments = trimmed.split("/") if trimmed else []
    if len(trimmed) > MAX_PREFIX_CHARS or not all(_PREFIX_SEGMENT.fullmatch(s) for s in segments):
        raise error(f"{setting} {quoted(prefix)}: expected {PREFIX_RULE}")
    return trimmed


def parse_account_endpoint(
    url: str, setting: str, error: ErrorType = InputError, expected: str = EXPECTED_ENDPOINT
) -> tuple[AccountEndpoint, list[str]]:
    """The account endpoint `url` starts with, and the path segments after it (a trailing '/' ignored).

    Credentials are refused, never echoed: user info, a query (a SAS token) or a fragment. A cloud account
    is served over https only; Azurite, on 127.0.0.1 or localhost, over http or https.
    """

    def bad(why: str) -> Exception:
        return error(f"{setting} {quoted(displayable_url(url), 120)}: {why}; expected {expected}")

    if any(mark in url for mark in "@?#"):
        raise bad(
            "credentials do not belong in the URL (no user info, query or fragment: they would end up in "
            "logs); use the managed identity, or a connection string for the emulator"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise bad("it cannot be parsed") from None
    host = parts.hostname or ""
    path = parts.path.removeprefix("/").removesuffix("/")
    segments = path.split("/") if path else []
    account, _, suffix = host.partition(".blob.")
    if suffix in CLOUD_SUFFIXES and parts.scheme == "https" and port in (None, 443):
        endpoint = AccountEndpoint(account, f"https://{host}", is_emulator=False)
    elif host in EMULATOR_HOSTS and parts.scheme in ("http", "https") and segments:
        account = segments.pop(0)
        netloc = f"{host}:{port}" if port else host
        endpoint = AccountEndpoint(account, f"{parts.scheme}://{netloc}/{account}", is_emulator=True)
    else:
        raise bad("the host is neither an Azure Blob Storage account over https nor Azurite, the emulator")
    if not _ACCOUNT_NAME.fullmatch(account):
        raise bad(f"{quoted(account)} is not a storage account name ({_ACCOUNT_RULE})")
    return endpoint, segments


def parse_blob_url(url: str, setting: str, error: ErrorType = InputError) -> BlobLocation:
    """Split a container URL with an optional prefix (see `EXPECTED_BLOB_URL`) into its parts."""

    def bad(why: str) -> Exception:
        return error(f"{setting} {quoted(displayable_url(url), 120)}: {why}; expected {EXPECTED_BLOB_URL}")

    endpoint, segments = parse_account_endpoint(url, setting, error, EXPECTED_BLOB_URL)
    if not segments:
        raise bad("it names no container")
    container, prefix = segments[0], "/".join(segments[1:])
    if not _CONTAINER_NAME.fullmatch(container):
        raise bad(f"{quoted(container)} is not a container name ({_CONTAINER_RULE})")
    check_prefix(
        prefix, setting, lambda _: bad(f"the prefix {quoted(prefix)} is not a folder path: {PREFIX_RULE}")
    )
    return BlobLocation(endpoint, container, prefix)


def name_in_container(url: str, container: str) -> str | None:
    """The blob name `url` gives in the container named `container` (unquoted, without a query); None
    when the URL is not of that container."""
    marker = f"/{container}/"
    if marker not in url:
        return None
    return unquote(url.split(marker, 1)[1].split("?", 1)[0])


def require_name_in_container(
    url: str, container: str, error: Callable[[str], Exception], expected: str
) -> str:
    """The blob name `url` gives in `container`; else `error` with one line naming the blob (masked), the
    container and which blobs were `expected` there. Each caller raises its own error, as its caller
    catches it (a pin's error fails that one file, a snapshot's the data version)."""
    name = name_in_container(url, container)
    if name is None:
        raise error(f"blob {displayable_url(url)}: not in the container {container}; expected {expected}")
    return name
