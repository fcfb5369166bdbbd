"""pytest plugin (``pytest11`` entry point) exposing detlaunch's test support to plugin authors."""
