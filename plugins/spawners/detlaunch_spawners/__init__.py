"""The built-in spawners of ``detlaunch --spawn``: ssh and srun (docs/SPAWN.md).

Plugins like any other (``detlaunch.plugins`` entry points), made only of the public API: a third
party's spawner (pdsh, a Kubernetes exec, Ray) is written the same way.
"""
