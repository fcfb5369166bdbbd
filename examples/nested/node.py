"""One rank of an outer job becomes one node of an inner detlaunch job.

    detlaunch --layer mpirun --hosts CHIEF:2 examples/nested/node.py [INNER OPTIONS...] -- SCRIPT [ARGS...]

The outer layer starts one rank per "node". Each rank replaces itself with

    detlaunch --layer torchrun --nnodes WORLD_SIZE --node-rank RANK [INNER OPTIONS...] -- SCRIPT [ARGS...]

with no --master-addr: the inner detlaunch takes its chief from DET_CHIEF_IP, which the outer
detlaunch exports to every process of its job. Nothing is rediscovered, and every inner node
agrees on the chief because they all inherited the same variable.
"""

import os
import sys

# The outer rank and size: Open MPI's variables (mpirun layer), else torchrun's.
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["RANK"]
size = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ["WORLD_SIZE"]
inner = [sys.executable, "-m", "detlaunch", "--layer", "torchrun", "--nnodes", size, "--node-rank", rank,
         *sys.argv[1:]]
os.execv(inner[0], inner)  # the outer wrapper's signals and exit status now belong to the inner detlaunch
