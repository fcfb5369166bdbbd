"""A Prometheus exporter for detlaunch (entry point ``detlaunch.plugins: prometheus``)."""
