"""detlaunch's errors: one base, subclasses named for what went wrong.

Every error carries a message meant for the user: one line saying what is
wrong and what to do. The CLI prints it without a traceback (unless --debug).
"""

import detlaunch.exit_codes as exit_codes

# Every character str.splitlines() breaks a line at, and every other control character but a tab: a value
# that holds one (a NEL in a flag, a terminal escape in a rank's last line) is shown escaped, so that a line
# stays the one line it promises to be, and nothing read from a log can drive the user's terminal.
_CONTROLS = [chr(c) for c in (*range(0x20), 0x7f, *range(0x80, 0xa0)) if c != 0x09] + ["\u2028", "\u2029"]
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in _CONTROLS})


def one_line(text: object) -> str:
    """`text` as one line: the characters that would break it are written as escapes."""
    return str(text).translate(_LINE_BREAKS)


class DetlaunchError(Exception):
    """Base of every error detlaunch reports to the user."""

    exit_code = exit_codes.FAILED


class ConfigError(DetlaunchError):
    """Bad input: a flag, an environment variable, a host list, a config file."""

    exit_code = exit_codes.USAGE


class LayerNotFoundError(ConfigError):
    """The layer asked for is not installed."""


class PluginLoadError(DetlaunchError):
    """A plugin (or the chosen layer) failed to import or register."""


class ClusterError(ConfigError):
    """Cluster discovery found something it cannot work with."""


class LaunchError(DetlaunchError):
    """The job could not be started (a peer's sshd never answered, a port was taken...)."""
