"""Small network checks layers run while planning (they open no connection to anyone)."""

from __future__ import annotations

import errno
import socket

from detlaunch.errors import ConfigError


def check_port_free(host: str, port: int, flag: str = "--master-port") -> None:
    """Raise ConfigError when `port` is already taken on `host` (a local address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode
        raise ConfigError(f"cannot resolve {host!r}: {getattr(e, 'strerror', None) or e}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the real listeners do: a port in TIME_WAIT from the last run is free; a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"{flag} {port} is already in use on {host}: "
                                  f"pick a free port with {flag} PORT") from None
            if e.errno == errno.EADDRNOTAVAIL:
                return  # not an address of this machine: the chief checks its own
            raise ConfigError(f"cannot use {flag} {port} on {host}: {e.strerror}; "
                              f"pick another with {flag} PORT") from None
