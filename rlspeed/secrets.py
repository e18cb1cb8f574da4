"""Passwords in URLs (``scheme://user:password@host``) are never shown, logged or written.

rlspeed takes URLs that may hold a password (``tracking.uri``, ``MLFLOW_TRACKING_URI``,
``hydra.sweeper.storage``, the ``trial.storage`` the Optuna sweeper hands its jobs, a URL in
task=gym's ``task.kwargs`` for the user's env). The process that connects (or makes the
env) needs the password; everything shown or stored gets it as
``user:***@host`` instead: ``mask`` for a string (a URL, or a line or file holding one),
``install`` for everything the process logs and prints. ``hide_in_arguments`` takes the
passwords off the command line before Hydra reads it, so that no config Hydra writes or
hands a launcher (``.hydra/``, ``multirun.yaml``, submitit's job pickles) holds one; the
processes of the command and its jobs get them back from the environment (``reveal``)
where they connect. A password can stay out of the command line altogether: see README,
"Passwords".
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any, TextIO

MASK = "***"
# scheme://user:password@: the password runs to the authority's last @ (a raw @ in it is
# common in pasted URLs), never past the end of the authority (/, ?, #), whitespace or a
# quote around the URL. Hydra shows an override's colons escaped (http\://user\:pw@host).
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*\\?://(?P<user>[^\s/?#@:'\"\\]*)\\?:)"
    r"(?P<password>[^\s/?#'\"]+)@(?P<host>[^\s/?#'\",@]*)"
)
# The passwords hide_in_arguments took off the command line, as JSON {"user@host": password}:
# in the environment, which the command's jobs inherit (worker processes, SLURM jobs).
PASSWORDS_VARIABLE = "RLSPEED_URL_PASSWORDS"


def mask(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    if "://" not in text:  # the common case, without a regex
        return text
    return _USERINFO.sub(rf"\g<head>{MASK}@\g<host>", text)


def _account(match: re.Match[str]) -> str:
    return f"{match['user']}@{match['host']}"


def hide_in_arguments(arguments: list[str]) -> list[str]:
    """``arguments`` with every URL's password masked; the passwords go to the environment
    (PASSWORDS_VARIABLE), for ``reveal``."""
    passwords = _stored_passwords()
    for argument in arguments:
        if "://" in argument:
            for match in _USERINFO.finditer(argument):
                if match["password"] != MASK:
                    passwords[_account(match)] = match["password"]
    if passwords:
        os.environ[PASSWORDS_VARIABLE] = json.dumps(passwords)
    return [mask(argument) for argument in arguments]


def reveal(url: str) -> str:
    """``url`` with a masked password (``user:***@host``) put back, where this process was
    given it (hide_in_arguments); any other URL as it is."""
    passwords = _stored_passwords()
    if not passwords or "://" not in url:
        return url

    def put_back(match: re.Match[str]) -> str:
        password = passwords.get(_account(match)) if match["password"] == MASK else None
        if password is None:
            return match[0]
        return f"{match['head']}{password}@{match['host']}"

    return _USERINFO.sub(put_back, url)


def _stored_passwords() -> dict[str, str]:
    try:
        passwords = json.loads(os.environ.get(PASSWORDS_VARIABLE, "{}"))
    except ValueError:  # not rlspeed's: nothing to put back
        return {}
    return passwords if isinstance(passwords, dict) else {}


def masked_accounts(text: str) -> list[str]:
    """The ``user@host`` of every URL in ``text`` whose password is masked (``user:***@host``):
    where ``reveal`` found nothing to put back, the password is not there."""
    if "://" not in text:
        return []
    return [_account(match) for match in _USERINFO.finditer(text) if match["password"] == MASK]


def _each_string(value: Any, change: Callable[[str], str]) -> Any:
    """``value`` with ``change`` applied to every string in it (dicts and lists walked)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: _each_string(item, change) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_each_string(item, change) for item in value)
    return value


def mask_value(value: Any) -> Any:
    """``value`` with ``mask`` applied to every string in it (dicts and lists walked)."""
    return _each_string(value, mask)


def reveal_value(value: Any) -> Any:
    """``value`` with ``reveal`` applied to every string in it (dicts and lists walked): what
    a user's code that connects is handed (task=gym's ``task.kwargs``)."""
    return _each_string(value, reveal)


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its ``user:password@``, and the user and password (decoded from
    percent-encoding; None where absent)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, has_password, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=host))
    decoded_password = urllib.parse.unquote(password) if has_password else None
    return bare, urllib.parse.unquote(user) or None, decoded_password


class _MaskedStream:
    """A text stream whose writes are masked; everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        if name == "_stream":  # not set yet (a copy in the making): no endless recursion
            raise AttributeError(name)
        return getattr(self._stream, name)


def _masking_factory(make: Callable[..., logging.LogRecord]) -> Any:
    """A log record factory: ``make``'s records with their message (and traceback) masked.

    At the record, not a handler: Hydra replaces the handlers at every job (the console and
    the job's ``rlspeed.log``), and libraries add their own."""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: logging reports it as usual
            return record
        masked = mask(message)
        if masked != message:  # else the record stays as made (msg may be an object)
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            if mask(text) != text:  # a formatter uses exc_text as given
                record.exc_text = mask(text)
        return record

    factory.masks_secrets = True  # type: ignore[attr-defined]
    return factory


def install(streams: bool = True) -> None:
    """Mask passwords in everything this process logs or prints from now on (its log
    records; with ``streams``, ``sys.stdout`` and ``sys.stderr`` too: the command's own
    process, not a notebook's). Idempotent."""
    if not getattr(logging.getLogRecordFactory(), "masks_secrets", False):
        logging.setLogRecordFactory(_masking_factory(logging.getLogRecordFactory()))
    if not streams:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _MaskedStream):
            setattr(sys, name, _MaskedStream(stream))
