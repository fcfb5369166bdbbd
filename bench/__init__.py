"""detlaunch's benchmarks against its peers: run `bench/run.sh` (see bench/README.md)."""
