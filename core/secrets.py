"""The one secret masking: what every record, log line, MLflow param and printed message passes through,
which names are a credential's, and the MLflow tracking credentials taken out of a URL so that they never
stand on a command line nor reach MLflow inside one."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from core.errors import InputError

log = logging.getLogger(__name__)

MASK = "***"  # what stands in a secret's place, wherever one is written

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


def is_secret_name(name: str) -> bool:
    """Whether a setting or option named `name` holds a credential (`api_token`, `client_secret`,
    `storage_key`, ...): the names whose values are masked wherever they are written."""
    return bool(_CREDENTIAL_KEY.fullmatch(name))


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
            mask_secrets_in(key): MASK
            if isinstance(item, str) and isinstance(key, str) and is_secret_name(key)
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


# Where MLflow looks for its stores when no URI is given to it.
MLFLOW_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def mlflow_credentials_apart(environ: MutableMapping[str, str], uri: str | None = None) -> str | None:
    """Take the user info out of every MLflow store URI a process was given, into MLflow's own credential
    variables in `environ`: MLFLOW_TRACKING_URI and MLFLOW_REGISTRY_URI are rewritten without it, and `uri`
    (a command's `--mlflow-tracking-uri`) comes back without it.

    MLflow writes the tracking URI it is given where no masking reaches: its "View run ... at: URI" lines
    go straight to sys.stdout (a step's log, a terminal). A URI with no user info has none to show, and
    MLflow still sends the user and password, as basic auth, from the variables; the processes this one
    starts inherit them. For a process's entry point, before MLflow is used. Two different logins cannot
    both be MLflow's (it takes one user and password per process): refused in one line."""
    given: dict[str, dict[str, str]] = {}
    for name in MLFLOW_URI_VARIABLES:
        if environ.get(name):
            environ[name], given[name] = tracking_credentials_apart(environ[name])
    if uri:
        uri, given["--mlflow-tracking-uri"] = tracking_credentials_apart(uri)
    logins = {where: login for where, login in given.items() if login}
    if len({tuple(sorted(login.items())) for login in logins.values()}) > 1:
        raise InputError(
            f"{' and '.join(logins)} carry different users or passwords; MLflow takes one login per process "
            f"({MLFLOW_USERNAME_VARIABLE}, {MLFLOW_PASSWORD_VARIABLE}): give the same one, or set those "
            "variables and leave the user info out of the URIs"
        )
    for login in logins.values():
        environ.update(login)
    return uri


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
