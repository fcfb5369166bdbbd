"""``--spawn srun``: inside a SLURM allocation (salloc, sbatch), one step of detlaunch, one task a node.

``srun --ntasks-per-node=1 --kill-on-bad-exit=1 detlaunch ...``: SLURM starts every node's detlaunch
and its discovery (the slurm provider) gives each its rank and the nodes; a node whose detlaunch fails
ends the step on every node. The nodes' detlaunch do not watch their stdin (srun gives it to task 0
only): a stop of the spawning command reaches srun as SIGTERM, on which SLURM ends the step everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from detlaunch import Config, ConfigError, NodeLaunch, SpawnRequest, hookimpl


class SrunSpawner:
    def launches(self, request: SpawnRequest) -> Sequence[NodeLaunch]:
        env = request.config.env
        if not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")):
            raise ConfigError("--spawn srun runs inside a SLURM allocation (salloc, sbatch): SLURM_JOB_ID is not set")
        if request.hosts:
            raise ConfigError("--spawn srun: SLURM names the nodes; drop --hosts/--hostfile")
        node = request.node_argv(None, watch_stdin=False)
        argv = ("srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--chdir={request.cwd}", *node)
        return [NodeLaunch(argv, "srun", env=dict(request.env))]  # srun passes its environment on to its tasks


@hookimpl
def detlaunch_spawners(config: Config) -> dict[str, SrunSpawner]:
    return {"srun": SrunSpawner()}
