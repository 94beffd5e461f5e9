"""Names as MLflow takes them: every metric, param and tag key the product logs passes through `mlflow_key`.

A key can come from a user's data or task: a drift feature (`psi.colour=yellow`), a task's metric
(`validation_recall@10`), a trigger's field. MLflow refuses a batch holding one key it does not accept
(mlflow.utils.validation): at most 250 characters, of letters, digits (Unicode ones included), `_`, `-`, `.`,
` ` and `/`, plus `:` except on Windows; and a key must stay itself as a path (no leading `/`, no empty, `.`
or `..` part, not starting with `..`).

`mlflow_key` keeps a name that is valid on every platform as it is, and escapes what is not, the way a URL
escapes: each UTF-8 byte of a character MLflow refuses becomes `-_` and two hex digits (`=` is `-_3d`, so
`psi.colour=yellow` is logged as `psi.colour-_3dyellow`). `:` is escaped too, so that a name is the same
whichever platform logs it. A literal `-_` is escaped as well (its `-`), and so is a `/` or `.` that would
break the path rule; so the mapping is injective and `original_name` reverses it. A key longer than 250
characters keeps its first 209 and ends in `-_sha256-` and 32 hex digits of the name's SHA-256, which no
escaped name can end in; only such a key cannot be reversed, and two names would share it only if their
digests did.

Whoever logs records what it renamed, so an MLflow user can go back from a key to the name: a run holds
`mlflow_names.json` ({MLflow key: name}, merged across everything logged to it), a registered version the
tag `retrain.mlflow_names` (the same JSON).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import posixpath
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from core.errors import RetrainError

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
ESCAPE = "-_"
NAMES_ARTIFACT = "mlflow_names.json"  # on a run: {MLflow key: name} of every key that differs from its name
NAMES_TAG = "retrain.mlflow_names"  # on a registered version: the same, for its tags

# MLflow's own character rule (validate_param_and_metric_name) without ':', which Windows refuses.
_KEPT = re.compile(r"[\w./ -]*")
_REFUSED = re.compile(r"[^\w./ -]")
_MARKER = re.compile(re.escape(ESCAPE))
_SLASH = re.compile("/")
_DIGEST = "sha256-"
_DIGEST_HEX = 32
_DIGEST_SUFFIX_LENGTH = len(ESCAPE) + len(_DIGEST) + _DIGEST_HEX
_ESCAPED_BYTE = re.compile(r"-_([0-9a-f]{2})")

V = TypeVar("V")


class NameCollision(RetrainError):
    """Two names that would be logged under one MLflow key."""


def mlflow_key(name: str) -> str:
    """`name` as an MLflow key: itself when MLflow takes it on every platform, else escaped (see above)."""
    if is_valid_key(name) and ESCAPE not in name:
        return name  # the common case, once per metric and step
    if name == "":
        return ESCAPE  # the marker alone: every other escape is followed by two hex digits
    escaped = _escaped_positions(name)
    parts = [_escaped_char(char) if index in escaped else char for index, char in enumerate(name)]
    key = "".join(parts)
    if len(key) > MAX_KEY_LENGTH:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_HEX]
        kept, length = [], 0
        for part in parts:  # whole escapes only, so the prefix reads back
            if length + len(part) > MAX_KEY_LENGTH - _DIGEST_SUFFIX_LENGTH:
                break
            kept.append(part)
            length += len(part)
        key = f"{''.join(kept)}{ESCAPE}{_DIGEST}{digest}"
    return key


def is_valid_key(key: str) -> bool:
    """Whether MLflow takes `key` on every platform: the rule every key `mlflow_key` makes keeps."""
    return (
        0 < len(key) <= MAX_KEY_LENGTH
        and _KEPT.fullmatch(key) is not None
        and posixpath.normpath(key) == key != "."
        and not key.startswith(("..", "/"))
    )


def original_name(key: str) -> str | None:
    """The name `mlflow_key` made `key` from; None for a shortened key (its name is in the recorded
    mapping) or a key it cannot have made."""
    if key == ESCAPE:
        return ""
    try:
        name = _unescaped(key)
    except UnicodeDecodeError:
        return None
    return name if name is not None and mlflow_key(name) == key else None


def _unescaped(key: str) -> str | None:
    pieces: list[str] = []
    pending = bytearray()
    index = 0
    while index < len(key):
        match = _ESCAPED_BYTE.match(key, index)
        if match is not None:
            pending.append(int(match.group(1), 16))
            index = match.end()
            continue
        if key.startswith(ESCAPE, index):
            return None  # the digest's marker, or not one of ours
        if pending:
            pieces.append(_decoded(pending))
            pending = bytearray()
        pieces.append(key[index])
        index += 1
    if pending:
        pieces.append(_decoded(pending))
    return "".join(pieces)


def keyed(entries: Mapping[str, V]) -> tuple[dict[str, V], dict[str, str]]:
    """`entries` under their MLflow keys, and {key: name} for each key that differs from its name.
    Refuses two names that share a key (two over-long names whose digests agree), rather than log one."""
    mapped: dict[str, V] = {}
    names: dict[str, str] = {}
    for name, value in entries.items():
        key = mlflow_key(name)
        if key in mapped and names.get(key, key) != name:
            raise NameCollision(
                f"names {names.get(key, key)!r} and {name!r} share the MLflow key {key!r}; rename one"
            )
        mapped[key] = value
        if key != name:
            names[key] = name
    return mapped, names


def record_renamed(client: Any, run_id: str, renamed: Mapping[str, str]) -> None:
    """Merge `renamed` ({key: name}) into the run's mlflow_names.json, so that what earlier steps or attempts
    logged to the run stays readable too."""
    if not renamed:
        return
    recorded = _recorded(client, run_id)
    merged = dict(recorded)
    for key, name in renamed.items():
        if merged.setdefault(key, name) != name:
            raise NameCollision(
                f"run {run_id} already logs {merged[key]!r} under the MLflow key {key!r}; {name!r} cannot "
                "share it: rename one"
            )
    if merged != recorded:
        client.log_dict(run_id, dict(sorted(merged.items())), NAMES_ARTIFACT)


def names_of(tags: Mapping[str, str]) -> dict[str, str]:
    """Each of a registered version's tag keys as the name it was made from (NAMES_TAG's mapping, else the
    key read back); a key that is not one of ours stays as it is."""
    recorded = _names_tag(tags.get(NAMES_TAG))
    return {key: recorded.get(key) or original_name(key) or key for key in tags if key != NAMES_TAG}


def version_tags(tags: Mapping[str, str], existing: Mapping[str, str] | None = None) -> dict[str, str]:
    """A registered version's tags under MLflow keys, with NAMES_TAG recording the keys that changed (merged
    with the version's `existing` tags' record)."""
    mapped, renamed = keyed(tags)
    if renamed:
        recorded = {**_names_tag((existing or {}).get(NAMES_TAG)), **renamed}
        mapped[NAMES_TAG] = json.dumps(dict(sorted(recorded.items())), sort_keys=True)
    return mapped


def _names_tag(text: str | None) -> dict[str, str]:
    try:
        recorded = json.loads(text or "{}")
    except ValueError:
        log.warning("tag %s is not JSON; tag keys are read back without it", NAMES_TAG)
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {str(key): str(name) for key, name in recorded.items()}


# -- escaping -------------------------------------------------------------------------------------------


def _escaped_positions(name: str) -> set[int]:
    """Where `name` holds a character MLflow refuses, a literal marker's `-`, or a `/` or `.` that would make
    MLflow read the key as another path (posixpath.normpath)."""
    escaped = {match.start() for match in _REFUSED.finditer(name)}
    escaped |= {match.start() for match in _MARKER.finditer(name)}
    separators = []  # the '/'s kept: not leading, not trailing, not the second of '//'
    for match in _SLASH.finditer(name):
        index = match.start()
        if index in (0, len(name) - 1) or (separators and separators[-1] == index - 1):
            escaped.add(index)
        else:
            separators.append(index)
    for start, end in zip([-1, *separators], [*separators, len(name)], strict=True):
        if name[start + 1 : end] in (".", ".."):  # a '.' or '..' part
            escaped.add(start + 1)
    if name.startswith("..") and 0 not in escaped:  # MLflow refuses a key that starts with '..'
        escaped.add(0)
    return escaped


@functools.lru_cache(maxsize=1024)
def _escaped_char(char: str) -> str:
    return "".join(f"{ESCAPE}{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))


def _decoded(pending: bytearray) -> str:
    return bytes(pending).decode("utf-8", "surrogatepass")  # UnicodeDecodeError: not one of our keys


def _recorded(client: Any, run_id: str) -> dict[str, str]:
    if not any(info.path == NAMES_ARTIFACT for info in client.list_artifacts(run_id)):
        return {}
    with tempfile.TemporaryDirectory(prefix="retrain-names-") as folder:
        path = Path(client.download_artifacts(run_id, NAMES_ARTIFACT, folder))
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            log.warning("run %s: %s is not JSON; it is written anew", run_id, NAMES_ARTIFACT)
            return {}
    if not isinstance(recorded, dict):
        return {}
    return {str(key): str(name) for key, name in recorded.items()}
