"""Blob names and URLs the front door may act on: inside the configured account, container and prefix (at
most the scope's depth of folder levels below it), and free of path tricks.

An event's subject (`/blobServices/default/containers/<c>/blobs/<name>`) and its `data.url` must name the
same blob, and both are checked before either is trusted. Refused everywhere: backslashes, control and
invisible characters, percent-encoded '.', '/', '\\' or control characters (so a name that only becomes a
traversal when decoded once more is refused too), and empty, '.' or '..' segments.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote, unquote, urlsplit

from core.secrets import displayable_url as common_displayable_url
from function_app.events.envelope import Invalid, has_unsafe_characters, shown
from function_app.settings.app import BLOB_CONTAINER, BLOB_PREFIX, BLOB_SUFFIXES, BlobScope

MAX_BLOB_NAME_CHARS = 1024  # Azure's limit
_ENCODED_TRICK = re.compile(r"%(?:2e|2f|5c|[01][0-9a-f]|7f)", re.IGNORECASE)
_SUBJECT = re.compile(r"/blobServices/default/containers/(?P<container>[^/]+)/blobs/(?P<name>.+)", re.DOTALL)
SUBJECT_FORM = "/blobServices/default/containers/<container>/blobs/<name>"


def check_raw(value: str, what: str) -> None:
    """Refuse what no honest blob name or URL of ours contains, before anything is split or decoded."""
    if "\\" in value:
        raise Invalid(f"{what} {shown(value)} has a backslash; expected '/'-separated names")
    if has_unsafe_characters(value):
        raise Invalid(f"{what} {shown(value)} has control or invisible characters; expected a plain name")
    if _ENCODED_TRICK.search(value):
        raise Invalid(
            f"{what} {shown(value)} has a percent-encoded '.', '/', '\\' or control character; expected "
            "plain path segments"
        )


def check_name(name: str, what: str) -> str:
    """A blob name (decoded), or a folder inside a container, with no traversal in it."""
    check_raw(name, what)
    if len(name) > MAX_BLOB_NAME_CHARS:
        raise Invalid(f"{what} has {len(name)} characters; expected at most {MAX_BLOB_NAME_CHARS}")
    if any(segment in ("", ".", "..") for segment in name.split("/")):
        raise Invalid(f"{what} {shown(name)} has an empty, '.' or '..' segment; expected a plain path")
    return name


def subject_blob(subject: str) -> tuple[str, str]:
    """(container, blob name) of a Blob Storage event subject."""
    what = "the event's subject"
    check_raw(subject, what)
    match = _SUBJECT.fullmatch(subject)
    if match is None:
        raise Invalid(f"{what} {shown(subject)} is not a blob's; expected {SUBJECT_FORM}")
    return match["container"], check_name(match["name"], f"{what}'s blob name")


def displayable_url(url: str) -> str:
    """`url` without the places a credential could hide (core.secrets.displayable_url), quoted as
    untrusted input is (`shown`: one line, bounded)."""
    return shown(common_displayable_url(url))


def url_blob(url: str, scope: BlobScope, what: str, *, data_lake: bool = False) -> tuple[str, str]:
    """(container, decoded name) of a URL in the configured account; the name is '' for the container
    itself. `data_lake` also accepts the account's Data Lake host (FlushWithClose events name it)."""
    _, container, name = url_blob_in(url, (scope,), what, data_lake=data_lake)
    return container, name


def url_blob_in(
    url: str, scopes: Sequence[BlobScope], what: str, *, data_lake: bool = False
) -> tuple[list[int], str, str]:
    """(the positions of the scopes whose account holds the URL, container, decoded name) of a URL in one
    of the accounts of `scopes` (at least one); raises `Invalid` when it is in none of them."""
    if "?" in url or "#" in url:
        raise Invalid(
            f"{what} {displayable_url(url)} carries a query or fragment; expected a plain blob URL "
            "(credentials do not belong in URLs)"
        )
    check_raw(url, what)
    expected = " or ".join(dict.fromkeys(f"{scope.container_url}/<name>" for scope in scopes))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Invalid(f"{what} {displayable_url(url)} cannot be parsed; expected {expected}") from None
    if "@" in parts.netloc:
        raise Invalid(f"{what} {displayable_url(url)} carries user info; expected a plain blob URL")
    held, path = [], None
    for position, scope in enumerate(scopes):
        in_account = _path_in_account(parts.scheme, parts.hostname or "", port, parts.path, scope, data_lake)
        if in_account is not None:
            held.append(position)
            path = in_account  # one account's path: the same for every scope in that account
    if path is None:
        accounts = dict.fromkeys(f"{scope.account!r} at {scope.endpoint.url}" for scope in scopes)
        raise Invalid(
            f"{what} {displayable_url(url)} is not in storage account {' or '.join(accounts)}; expected "
            f"{expected}"
        )
    container, _, raw_name = path.partition("/")
    try:
        name = unquote(raw_name, errors="strict")
    except UnicodeDecodeError:
        raise Invalid(f"{what} {displayable_url(url)} has percent-encoding that is not UTF-8") from None
    return held, container, name


def _path_in_account(
    scheme: str, host: str, port: int | None, path: str, scope: BlobScope, data_lake: bool
) -> str | None:
    """The path after the account part ('<container>/<name>'), or None if the URL is another account's."""
    endpoint = urlsplit(scope.endpoint.url)
    if scope.endpoint.is_emulator:
        if (scheme, host, port) != (endpoint.scheme, endpoint.hostname, endpoint.port):
            return None
        account, _, rest = path.removeprefix("/").partition("/")
        return rest if account == scope.account else None
    hosts = {endpoint.hostname}
    if data_lake and scope.endpoint.dfs_url:
        hosts.add(urlsplit(scope.endpoint.dfs_url).hostname)
    if scheme != "https" or port not in (None, 443) or host not in hosts:
        return None
    return path.removeprefix("/")


def misplacement(name: str, scope: BlobScope, whose: str = "") -> str | None:
    """Why blob `name` (already free of path tricks: check_name) is not where the scope's data lies, as the
    rest of a sentence that starts with the blob; None when it is in place: under the prefix, in at most
    `depth - 1` levels of sub-folders (the image task's class folders), none of them hidden (a task skips
    those, as a data version does: components/data_version.is_raw_name). `whose` follows the prefix in the
    text (" of model 'shapes'")."""
    prefix = f"{scope.folder or '/'!r}{whose}"
    if not name.startswith(scope.folder):
        return f"is outside the prefix {prefix}"
    folders = name[len(scope.folder) :].split("/")[:-1]
    if len(folders) >= scope.depth and scope.depth == 1:
        return (
            f"is in a sub-folder of the prefix {prefix}; expected a file directly under it (a data version "
            "pins only those)"
        )
    if len(folders) >= scope.depth:
        return (
            f"lies {len(folders)} folder levels below the prefix {prefix}; expected at most "
            f"{scope.depth - 1} (class folders: <prefix>/<class>/<file>; a data version pins only those)"
        )
    hidden = next((folder for folder in folders if folder.startswith(".")), None)
    if hidden is not None:
        return (
            f"is in the hidden folder {shown(hidden)} below the prefix {prefix}; expected a visible folder "
            "(a hidden one is not data)"
        )
    return None


def check_blob_in_scope(container: str, name: str, scope: BlobScope) -> None:
    """A data file of this front door: the configured container, in place under the prefix (misplacement),
    a known suffix."""
    check_container(container, scope)
    problem = misplacement(name, scope)
    if problem is not None:
        setting = f" ({BLOB_PREFIX})" if not name.startswith(scope.folder) else ""
        raise Invalid(f"blob {shown(name)} {problem}{setting}")
    if not name.endswith(scope.suffixes):
        raise Invalid(
            f"blob {shown(name)} has none of the suffixes {', '.join(scope.suffixes)} ({BLOB_SUFFIXES})"
        )


def check_folder_in_scope(container: str, folder: str, scope: BlobScope) -> None:
    """A data folder: the configured container, at or below the prefix."""
    check_container(container, scope)
    if scope.prefix and folder != scope.prefix and not folder.startswith(scope.folder):
        raise Invalid(f"folder {shown(folder)} is outside the prefix {scope.folder!r} ({BLOB_PREFIX})")


def check_container(container: str, scope: BlobScope) -> None:
    if container != scope.container:
        raise Invalid(
            f"container {shown(container)} is not the configured container {scope.container!r} "
            f"({BLOB_CONTAINER})"
        )


def blob_url(scope: BlobScope, name: str) -> str:
    """The canonical URL of a blob (or folder), encoded as the storage SDK encodes names."""
    return f"{scope.container_url}/{quote(name, safe='/~')}" if name else scope.container_url
