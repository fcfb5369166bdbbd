"""Headless Chromium for the tests of a job's page: the flags that load a page with nothing leaving the machine,
and what the browser's network log says the page asked for.

scripts/setup.sh installs Debian's `chromium`. The tests drive it from its command line (`--dump-dom` prints
the DOM once the page has loaded and its scripts ran, `--screenshot` draws it), through the suite's runner,
so every process it starts is the test's and is checked for leftovers. The browser's own background
requests (updates, sign-in, a spelling dictionary) are turned off where a flag can, and whatever is left is
sent to a proxy on a closed loopback port, with every name unresolvable: no byte leaves the machine, and the
network log (`--log-net-log`) still names each request, so a request of the page's is seen even though it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("headless Chromium is not installed: scripts/setup.sh installs Debian's chromium package")
    return path


def flags(work: Path) -> list[str]:
    """Headless, a profile of its own under `work`, no request reaching beyond a closed port of this machine."""
    sandbox = ["--no-sandbox"] if os.getuid() == 0 else []  # Chromium refuses to run as root with its sandbox
    return ["--headless", *sandbox, "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", "--disable-breakpad", "--mute-audio",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={work / 'chromium-profile'}", f"--crash-dumps-dir={work / 'chromium-crashes'}"]


def env() -> dict[str, str]:
    """A short TMPDIR: Chromium's singleton socket goes there, and a Unix socket's path has at most 107 bytes."""
    tmp = tempfile.gettempdir()
    return {"TMPDIR": tmp if len(tmp) < 40 else "/tmp"}


def page_requests(net_log: Path) -> list[str]:
    """The URLs the page asked for (a request whose top frame is a file:// page), from Chromium's network log."""
    log = json.loads(net_log.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if event["type"] == start_job and "file://" in str(params.get("network_isolation_key", "")):
            urls.append(str(params.get("url")))
    return urls


def drawn_ms(dom: str) -> float | None:
    """When the page was laid out after loading (its own script marks it, forcing the layout), in ms from navigation."""
    found = re.search(r'data-drawn-ms="(\d+)"', dom)
    return float(found.group(1)) if found else None
