"""Talking to the Determined master: one authenticated POST, retried while the master is unreachable.

The seed's worker stage marks a node's resources as a daemon so that the master stops
them once every non-daemon resource (the chief's launcher) has exited. Determined's
harness does it through its TaskSession; this is the same request with requests alone:

- auth: ``Grpc-Metadata-x-allocation-token: Bearer <session token>`` (TaskSession's header);
- TLS: ``DET_MASTER_CERT_FILE`` is a CA bundle to trust, or ``noverify``;
  ``DET_MASTER_CERT_NAME`` is the name the master's certificate must carry (as
  Determined's own HTTPS adapter checks it);
- a connect and a read timeout on every attempt;
- retries, with backoff, on connection errors only (refused, reset, unreachable, a
  connect timeout: the master restarting, or not routable yet). Marking is idempotent,
  so a retry is safe even when a reset came after the master got the request. Anything
  else (a TLS failure, a read timeout, an HTTP error) is one clear LaunchError line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import requests
import requests.adapters

from detlaunch.errors import ConfigError, LaunchError

AUTH_HEADER = "Grpc-Metadata-x-allocation-token"
ATTEMPTS = 6
FIRST_DELAY = 0.25  # then 0.5, 1, 2, 4 s: about 8 s in all before giving up
MAX_DELAY = 4.0
TIMEOUT = (5.0, 30.0)  # connect, read


def canonical_url(url: str) -> str:
    """Determined's canonical master URL: explicit scheme and port, no trailing slash."""
    text = url.strip()
    if text.startswith("https://"):
        default = 443
    elif text.startswith("http://"):
        default = 80
    else:
        text, default = f"http://{text}", 8080
    parsed = urllib.parse.urlparse(text)
    try:
        port = parsed.port or default
    except ValueError:
        raise ConfigError(f"bad Determined master URL {url!r}: the port is not a number") from None
    if not parsed.hostname or parsed.query or parsed.fragment or parsed.username:
        raise ConfigError(f"bad Determined master URL {url!r}: write scheme://host:port")
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return urllib.parse.urlunparse((parsed.scheme, f"{host}:{port}", parsed.path, "", "", "")).rstrip("/")


@dataclasses.dataclass(frozen=True)
class Master:
    """Where the master is and how to authenticate to it."""

    url: str
    token: str
    verify: bool | str = True  # a CA bundle path, True (system CAs) or False (noverify)
    cert_name: str | None = None


class _CertNameAdapter(requests.adapters.HTTPAdapter):
    """Checks the master's certificate against `cert_name` instead of the URL's host."""

    def __init__(self, cert_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cert_name = cert_name

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        super().cert_verify(conn, url, verify, cert)  # type: ignore[no-untyped-call]
        conn.assert_hostname = self.cert_name


def _session(master: Master) -> requests.Session:
    s = requests.Session()
    s.headers[AUTH_HEADER] = f"Bearer {master.token}"
    s.verify = master.verify
    s.trust_env = False  # no proxy from the environment: the master is reached directly
    if master.cert_name:
        s.mount("https://", _CertNameAdapter(master.cert_name))
    return s


def _reason(e: BaseException) -> str:
    """The innermost reason of a requests/urllib3 error, in a few words."""
    text = str(e)
    for marker in ("Connection refused", "Name or service not known", "timed out", "No route to host",
                   "Temporary failure in name resolution", "Network is unreachable"):
        if marker in text:
            return marker
    return text.splitlines()[0][:200] if text else type(e).__name__


def _http_error(method: str, url: str, r: requests.Response) -> LaunchError:
    detail = ""
    try:
        body = r.json()
        if isinstance(body, dict):  # as Determined reads it: message, else error.message, else error.error
            error = body.get("error")
            if isinstance(error, dict):
                error = error.get("message") or error.get("error")
            detail = str(body.get("message") or error or "")
    except (ValueError, json.JSONDecodeError):
        detail = r.text
    detail = " ".join(detail.split())[:200]
    hint = {401: "the session token (DET_SESSION_TOKEN) was refused",
            403: "the session token may not do this",
            404: "no such allocation or resources (DET_ALLOCATION_ID, DET_RESOURCES_ID)"}.get(
        r.status_code, "see the master's log")
    what = f": {detail}" if detail else ""
    return LaunchError(f"the Determined master answered {r.status_code} {r.reason} to {method} {url}{what} ({hint})")


def post(master: Master, path: str, *, attempts: int = ATTEMPTS, first_delay: float = FIRST_DELAY,
         timeout: tuple[float, float] = TIMEOUT,
         warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> requests.Response:
    """POST `path` to the master; retry only failed connections; raise one LaunchError line otherwise."""
    url = f"{master.url}/{path.lstrip('/')}"
    delay = first_delay
    with _session(master) as s:
        for attempt in range(1, attempts + 1):
            try:
                r = s.post(url, timeout=timeout)
            except requests.exceptions.SSLError as e:
                raise LaunchError(f"TLS to the Determined master at {master.url} failed ({_reason(e)}): set "
                                  "DET_MASTER_CERT_FILE to its CA bundle, DET_MASTER_CERT_NAME to the name in "
                                  "its certificate, or DET_MASTER_CERT_FILE=noverify") from None
            except requests.exceptions.ConnectionError as e:  # refused, reset, unreachable, connect timeout
                if attempt == attempts:
                    raise LaunchError(f"cannot reach the Determined master at {master.url} ({_reason(e)}) "
                                      f"after {attempts} attempts: is DET_MASTER right and the master up?") from None
                warn(f"detlaunch: the Determined master at {master.url} is not reachable ({_reason(e)}); "
                     f"retrying in {delay:g} s ({attempt}/{attempts - 1})")
                time.sleep(delay)
                delay = min(delay * 2, MAX_DELAY)
                continue
            except requests.exceptions.Timeout:
                raise LaunchError(f"the Determined master at {master.url} did not answer POST {url} "
                                  f"within {timeout[1]:g} s") from None
            except requests.exceptions.RequestException as e:
                raise LaunchError(f"POST {url} failed: {_reason(e)}") from None
            if r.status_code >= 300:
                raise _http_error("POST", url, r)
            return r
    raise AssertionError("unreachable")  # the loop returns or raises


def mark_daemon(master: Master, allocation_id: str, resources_id: str, **kwargs: Any) -> None:
    """Tell the master these resources only serve the job (sshd): stop them when the others end."""
    alloc, res = (urllib.parse.quote(x, safe="") for x in (allocation_id, resources_id))
    post(master, f"/api/v1/allocations/{alloc}/resources/{res}/daemon", **kwargs)
