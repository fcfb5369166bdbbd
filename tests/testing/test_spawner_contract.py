"""The spawner contract suite (detlaunch.testing.SpawnerContract) against the built-in spawners: the three
lines a third party writes. It plans only: no process starts."""

from __future__ import annotations

from detlaunch.testing import SpawnerContract


class TestSsh(SpawnerContract):
    spawner = "ssh"


class TestSrun(SpawnerContract):
    spawner = "srun"
    hosts = ()
    env = {"SLURM_JOB_ID": "41"}
