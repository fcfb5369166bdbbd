"""An Open MPI launch layer for detlaunch (entry point ``detlaunch.layers: mpirun``)."""
