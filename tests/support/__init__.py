"""What the tests share: where things are (`paths`), running real jobs (`jobs`), small helpers,
the SLURM test cluster, the example plugins, fixtures for plugin tests and the ranks' scripts."""
