"""detlaunch's errors: one base, subclasses named for what went wrong.

Every error carries a message meant for the user: one line saying what is
wrong and what to do. The CLI prints it without a traceback (unless --debug).
"""

import detlaunch.exit_codes as exit_codes


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
