"""The helpers every room needs, written once: blob URL parsing with secret masking and the prefix rule,
escaping what quotes data, the atomic file write, the file sha256, the renewal of a held lease and the
exclusive file lock (the spot and checkpoint-interval formulas are training/spot.py's). function_app/ and
components/ import it too, and the Function App ships it of training/ (.funcignore): standard library and
training.errors only. Parsers take
the name of the setting or option they read and the error type their caller raises, so that each message
names what the user typed where they typed it."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import re
import secrets
import stat
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit, urlunsplit

from training.errors import InputError

ErrorType = Callable[[str], Exception]

log = logging.getLogger(__name__)

# -- secrets in text ------------------------------------------------------------------------------------

# Where a credential hides in text that names a location or a setting. One list, applied to everything this
# project writes or prints (records, logs, cache entries, MLflow tags and params, command output):
# - a URL's user info, up to the last '@' of the token (a pasted key may itself contain '/'), after a scheme
#   and any number of slashes: `https://user:pw@host`, and `https:/user:pw@host` as a path spells it;
# - user info without a scheme, `user:pw@host`, where the host looks like one (has a '.' or a port, or is
#   localhost or [IPv6]): a password needs the ':' (`git@host` names no secret), and `azureml:asset@latest`
#   is an asset, not a login;
# - the value of a parameter whose name says it is a credential, wherever it stands (a URL's query, a
#   connection string's `Name=value;`, a `name=value` option or log line, a quoted `"name": "value"` as
#   JSON and Python write it, a `Name: value` header or YAML line, at the start of a line: prose such as
#   "nothing secret: ..." is left alone): a name ending in token, secret,
#   password, passwd, pwd, sig or signature (a SAS signature; SharedAccessSignature), apikey, or
#   <api|access|account|client|encryption|master|primary|private|sas|secondary|secret|shared access|signing|
#   storage|subscription>[_-]key (AccountKey, SharedAccessKey, x-api-key, aws_secret_access_key); case does
#   not matter;
# - in a URL's query only, the short names that are credentials there but ordinary words elsewhere: `key`
#   (an API key) and `code` (an Azure Functions key, an OAuth authorization code);
# - the credential of an HTTP Authorization header: `Bearer <token>` anywhere, `Authorization: <scheme>
#   <credential>` (Basic), `SharedKey account:<signature>`.
# A SAS token's other parameters (sv, se, sp, sr, st, spr, skoid...) describe it and are kept: they are no
# secret, and the expiry `se` is often what explains a failure.
_CREDENTIAL_NAME = (
    r"[\w.-]*?(?:token|secret|password|passwd|pwd|sig|signature|apikey"
    r"|(?:api|access|account|client|encryption|master|primary|private|sas|secondary|secret|shared_?access"
    r"|signing|storage|subscription)[_-]?key)"
)
# A ':' that ends a message's subject ("--data URL: why") is not part of the value.
_VALUE = r"(?:[^&;,:\s'\"#<>]|:(?!\s|$))+"
_HOST = r"(?:[\w-]+\.)+[\w-]+|[\w-]+:\d|localhost\b|\["
_SECRET_PATTERNS = (
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*:/+)[^\s'\"]*@"), r"\1***@"),
    (re.compile(rf"(?i)(?<![\w.%+:/@-])([\w.%+-]+:)[^\s'\"/@:]+@(?={_HOST})"), r"\1***@"),
    (re.compile(rf"(?i)(?<![\w.-])({_CREDENTIAL_NAME}=){_VALUE}"), r"\1***"),
    (re.compile(rf"(?i)([\"']{_CREDENTIAL_NAME}[\"']:\s*[\"']?)[^\s'\",;&}}]+"), r"\1***"),
    (re.compile(rf"(?im)(^[ \t]*{_CREDENTIAL_NAME}:[ \t]*)[^\s'\",;&]+"), r"\1***"),
    (re.compile(rf"(?i)([?&](?:key|code)=){_VALUE}"), r"\1***"),
    (re.compile(r"(?i)(\bBearer\s+|\bAuthorization:\s*\w+\s+)[A-Za-z0-9._~+/-]+=*"), r"\1***"),
    (re.compile(r"(?i)(\bSharedKey(?:Lite)?\s+[^:\s]+:)[^\s'\"]+"), r"\1***"),
)
_CREDENTIAL_KEY = re.compile(f"(?i){_CREDENTIAL_NAME}")


def mask_secrets(text: str) -> str:
    """`text` with every credential `_SECRET_PATTERNS` finds replaced by '***': what may be written."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def mask_secrets_in(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every string in it, keys included, masked,
    and a text under a credential's name (`{"password": ...}`) hidden whole: a record before it is written
    or printed."""
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, Mapping):
        return {
            mask_secrets_in(key): "***"
            if isinstance(item, str) and isinstance(key, str) and _CREDENTIAL_KEY.fullmatch(key)
            else mask_secrets_in(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_secrets_in(item) for item in value]
    return value


def _masking(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """A log record factory that masks each record as it is made: its message, its traceback and its stack,
    so that no handler of any logger (MLflow's own, which does not propagate to the root, included) can
    write the secret."""

    def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it when the record is written
            return record
        if (masked := mask_secrets(message)) != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:  # formatters reuse exc_text as it is
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = mask_secrets(record.stack_info)
        return record

    masked_record.masks_secrets = True  # type: ignore[attr-defined]
    return masked_record


def mask_logged_secrets() -> None:
    """Mask every log record this process makes, from now on. For the entry points of processes whose
    output is kept (a step's log, a terminal): libraries log the URLs they were given (MLflow quotes its
    tracking URI in its errors and warnings, through a handler of its own), and no caller can mask those
    messages before they are made. Idempotent: one layer of masking."""
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "masks_secrets", False):
        logging.setLogRecordFactory(_masking(factory))


# MLflow's REST client sends these as basic auth (mlflow.environment_variables).
MLFLOW_USERNAME_VARIABLE = "MLFLOW_TRACKING_USERNAME"
MLFLOW_PASSWORD_VARIABLE = "MLFLOW_TRACKING_PASSWORD"  # noqa: S105 - the variable's name, not a password


def tracking_credentials_apart(uri: str) -> tuple[str, dict[str, str]]:
    """An http(s) MLflow tracking URI without its user info, and the environment that carries the user
    info instead; any other URI as it is, and no environment.

    A child process is given the pair, never the whole URI: a command line is readable by every user of
    the machine (`ps`), and it is what step logs and run records quote. The variables are MLflow's own, so
    the password still reaches the one process that needs it. User info is split as requests (and so
    MLflow) would split it, and percent-decoded as requests decodes it."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URL this helper can take apart; the trainer reports it
        return uri, {}
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return uri, {}
    user_info, _, host = parts.netloc.rpartition("@")
    user, _, password = user_info.partition(":")
    environment = {MLFLOW_USERNAME_VARIABLE: unquote(user), MLFLOW_PASSWORD_VARIABLE: unquote(password)}
    return urlunsplit(parts._replace(netloc=host)), environment


def displayable_url(url: str) -> str:
    """`url` for a message: without user info, query or fragment (the places a secret hides), then masked.

    A pasted key or signature may hold '/', '?', '#' or '@', so no URL parser can be trusted to find where
    the user info or the query ends: the user info is everything up to the last '@', and the query starts
    at the first '?' or '#' after it. When a '?' or '#' comes before that '@' it is unknowable which part is
    the host, and none of the URL after the scheme is shown."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return mask_secrets(re.split(r"[?#]", url, maxsplit=1)[0])
    user_info_end = rest.rfind("@")
    if user_info_end >= 0:
        if re.search(r"[?#]", rest[:user_info_end]):
            return f"{scheme}{separator}***"
        rest = rest[user_info_end + 1 :]
    return mask_secrets(f"{scheme}{separator}{re.split(r'[?#]', rest, maxsplit=1)[0]}")


def quoted(value: object, limit: int = 80) -> str:
    """A value for an error message: masked, clipped, and one line (repr escapes breaks)."""
    text = mask_secrets(str(value))
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


# Control characters (ESC, BEL, CR, LF, other C0 and C1), invisible format characters (bidi overrides,
# zero-width) and line/paragraph separators: quoted raw, any of them can rewrite or hide a terminal line.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Plus lone surrogates: a file name that is not UTF-8 decodes to them, and they cannot be printed.
_ESCAPED_CATEGORIES = _UNSAFE_CATEGORIES | {"Cs"}


def has_unsafe_characters(text: str) -> bool:
    """Whether `text` holds a control, invisible format or line separator character."""
    return any(unicodedata.category(char) in _UNSAFE_CATEGORIES for char in text)


def escaped(value: object) -> str:
    """`value` as text for a message or log line, each unsafe character or lone surrogate written as its
    Python escape (ESC as \\x1b); the rest, non-ASCII letters included, is left readable."""
    return "".join(
        ascii(char)[1:-1] if unicodedata.category(char) in _ESCAPED_CATEGORIES else char
        for char in str(value)
    )


# -- blob URLs ------------------------------------------------------------------------------------------

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


# -- files ----------------------------------------------------------------------------------------------

_HASH_CHUNK_BYTES = 1 << 20


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in chunks (a data file may not fit in memory)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def make_read_only(folder: Path) -> None:
    """Take the write bits off every file under `folder` (published data and step outputs): a process that
    opens one to write fails loudly instead of silently changing what others reuse. Folders keep theirs,
    so that removing a version (`rm -rf`, shutil.rmtree) needs no chmod first; the content hashes that
    are checked before reuse catch what a mode cannot stop (root, or a file replaced by a rename)."""
    for parent, _, filenames in os.walk(folder):
        for name in filenames:
            path = Path(parent, name)
            path.chmod(stat.S_IMODE(path.lstat().st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


# -- a task's source -------------------------------------------------------------------------------------


def module_sources(module: str, search_path: Sequence[str]) -> dict[str, Path]:
    """The source files a `package.module:Attr` task runs from, found without importing anything, each by
    its name relative to the folder holding its top-level package; {} when `search_path` has no `module`.

    A module's code is its whole top-level package's `.py` files: importing `pkg.mod` runs `pkg/__init__`,
    and a module imports its siblings. A top-level module alone is its file. Code it imports from other
    packages is the environment's. `search_path` is the steps' sys.path: importlib.machinery.PathFinder
    walks it without executing any `__init__` (importlib.util.find_spec would import the parents of a
    dotted name); a top-level name only the interpreter's own finders know (an editable install's) is
    asked of find_spec, which imports nothing for a top-level name.
    """
    top = module.partition(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [entry for entry in search_path if entry])
    if spec is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return {}
    if spec is None:
        return {}
    if spec.submodule_search_locations:  # a package; a namespace package may span several folders
        files: dict[str, Path] = {}
        for location in spec.submodule_search_locations:
            for folder, dirnames, filenames in os.walk(location):
                # Only folders that can be subpackages: not __pycache__, .git or a data folder's "my-files".
                dirnames[:] = sorted(
                    name for name in dirnames if name.isidentifier() and name != "__pycache__"
                )
                relative = PurePosixPath(top, Path(folder).relative_to(location).as_posix())
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        files.setdefault((relative / name).as_posix(), Path(folder, name))
        return files
    origin = Path(spec.origin) if spec.origin else None
    return {origin.name: origin} if origin is not None and origin.is_file() else {}


def sources_sha256(sources: Mapping[str, Path]) -> tuple[dict[str, str], str]:
    """Each source file's sha256, by name, and one hex sha256 of the names and contents together."""
    hashes = {name: file_sha256(sources[name]) for name in sorted(sources)}
    listing = "".join(f"{name}\0{digest}\n" for name, digest in hashes.items())
    return hashes, hashlib.sha256(listing.encode()).hexdigest()


def module_sources_sha256(module: str, search_path: Sequence[str]) -> str | None:
    """The one hash of a module task's source files (module_sources); None when it is not found."""
    sources = module_sources(module, search_path)
    return sources_sha256(sources)[1] if sources else None


Content = bytes | Callable[[BinaryIO], Any]


def write_atomically(path: Path, content: Content, *, sync_folder: bool = False) -> None:
    """Replace `path` whole: readers (and a crash) see the old file or the new one, never a part.

    `content` is the bytes, or a function that writes them to a binary handle. The bytes are fsynced
    before the rename; `sync_folder` also fsyncs the folder after it, so that the new name itself survives
    a power loss (a record whose write was acknowledged must).
    """
    with _temporary_sibling(path, content) as temporary:
        os.replace(temporary, path)
    if sync_folder:
        fsync_folder(path.parent)


def create_atomically(path: Path, content: Content, *, sync_folder: bool = False) -> bool:
    """Create `path` whole if it does not exist; False, and nothing written, if it does (another writer won).

    The file is linked into place, which fails on an existing name, so two writers racing for one name
    never overwrite each other.
    """
    with _temporary_sibling(path, content) as temporary:
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
    if sync_folder:
        fsync_folder(path.parent)
    return True


@contextmanager
def _temporary_sibling(path: Path, content: Content) -> Iterator[Path]:
    """A hidden, fsynced temporary file beside `path` holding `content`, removed when the block ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, so listings and watchers skip it; 0o666 less the umask, the mode a plain open() gives.
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            if isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before a name points at them
        yield temporary
    finally:
        temporary.unlink(missing_ok=True)


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries durable: a file created, renamed or deleted in it survives a crash."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# -- leases ---------------------------------------------------------------------------------------------


class LeaseRenewal:
    """Keeps a held lease alive: calls `renew` every `every_seconds` on a daemon thread until `stop()`.

    `lost` turns true at the first renewal that fails (logged once, naming `what`; the thread then ends),
    and also once no renewal has succeeded for `valid_seconds - every_seconds`, the lease's duration less
    one period: a renewal call that hangs cannot be interrupted, and its holder must stop writing before
    the lease may have expired and another holder may have taken it. `describe` turns a failure into a
    secret-free reason for the log.
    """

    def __init__(
        self,
        renew: Callable[[], object],
        every_seconds: float,
        valid_seconds: float,
        what: str,
        describe: Callable[[BaseException], str] = lambda error: type(error).__name__,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < every_seconds < valid_seconds:
            raise ValueError(f"renewing every {every_seconds} s cannot keep a {valid_seconds} s lease")
        self._renew_call = renew
        self._every_seconds = every_seconds
        self._stale_after = valid_seconds - every_seconds
        self._what = what
        self._describe = describe
        self._clock = clock
        self._renewed_at = clock()  # the lease was just acquired (or renewed) by the caller
        self._failed = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"renew {what}"[:60], daemon=True)
        self.thread.start()

    @property
    def lost(self) -> bool:
        return self._failed or self._clock() - self._renewed_at >= self._stale_after

    def stop(self) -> None:
        """Stop renewing (waits for a renewal in progress); the caller then releases the lease itself."""
        self._stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every_seconds):
            started = self._clock()  # the service counts the new period from no earlier than this
            try:
                self._renew_call()
            except Exception as error:  # whatever stops the renewal loses the lease: the holder must know
                self._failed = True
                log.warning("lost %s: %s", self._what, self._describe(error))
                return
            self._renewed_at = started


# -- one process at a time -------------------------------------------------------------------------------

_HOLDER_BYTES = 512


@contextmanager
def exclusive_file_lock(
    path: Path, holder: str, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive flock(2) on `path` (created if absent) for the block, waiting as long as it takes.

    For processes sharing one machine's folder. The kernel drops a dead process's lock, so a crash never
    leaves it held; the descriptor is not inherited by child processes, so a step started meanwhile does
    not keep it either. `holder` (who holds it, for a person wondering why something waits) is written into
    the file once the lock is taken; when another process holds it, `on_wait` first gets that process's
    text ("" if it has not written it yet). A signal that raises (Ctrl-C) ends the wait.
    """
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(os.pread(descriptor, _HOLDER_BYTES, 0).decode(errors="replace").strip())
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, holder.encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock
