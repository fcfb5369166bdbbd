"""The spawner contract suite: what a ``--spawn`` spawner must do, for any spawner (docs/HOOKS.md).

Three lines run it against an installed spawner::

    from detlaunch.testing import SpawnerContract

    class TestMySpawner(SpawnerContract):
        spawner = "pdsh"                 # its name in its detlaunch_spawners hook

Every check plans in this process (no process starts): the spawner is found through the real plugin
loader; every node's detlaunch is reached with exactly the words it must get (a script path and
arguments holding spaces, quotes, ``$``, a newline and unicode), in the working directory; the variables
asked for reach it, never on a command line; and the same request gives the same launches, one per node.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Any, ClassVar

from detlaunch.planning.config import Config
from detlaunch.planning.plugin_manager import PluginSet
from detlaunch.planning.spawn import NodeLaunch, SpawnRequest

TRICKY_ARGV = ("--layer", "direct", "--nproc-per-node", "2", "my dir/$x 'é\"q\".py", "a b", "$HOME", "`id`; ls",
               "line\nbreak", "ünï")
TRICKY_CWD = "/tmp/a dir/it's $here"
TRICKY_ENV = {"DL_VAR": "va lue $x 'q'", "PYTHONPATH": "/p/ä:/q"}


def contains(words: Sequence[str], part: Sequence[str]) -> bool:
    return any(list(words[i : i + len(part)]) == list(part) for i in range(len(words) - len(part) + 1))


def reached(launch: NodeLaunch, request: SpawnRequest) -> list[str] | None:
    """The words that run the node's detlaunch, as its shell (if any) reads them; None when not found."""
    wanted = [request.node_argv(launch.node, watch) for watch in (True, False)]
    candidates = [list(launch.argv)]
    for word in launch.argv:
        try:
            candidates.append(shlex.split(word))
        except ValueError:
            continue
    for words in candidates:
        if any(contains(words, w) for w in wanted):
            return words
    return None


class SpawnerContract:
    """Subclass it with ``spawner = "NAME"``; ``hosts`` (default three) and ``env`` (what the spawning
    command's environment holds: SLURM's variables for a scheduler's spawner) fit the request to it."""

    spawner: ClassVar[str] = ""
    hosts: ClassVar[tuple[str, ...]] = ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    env: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.spawner:
            raise TypeError(f"{cls.__name__} must set spawner = 'NAME' (its name in detlaunch_spawners)")

    def config(self) -> Config:
        env = {**os.environ, **self.env}
        return Config(layer="direct", command=(), launcher_args=(), options={"spawn": self.spawner}, env=env)

    def request(self) -> SpawnRequest:
        return SpawnRequest(hosts=self.hosts, argv=TRICKY_ARGV, detlaunch=("/opt/py thon/python3", "-m", "detlaunch"),
                            cwd=TRICKY_CWD, env=TRICKY_ENV, config=self.config(), ssh_opts=("-p", "2222"),
                            version="9.9.9")

    def launches(self) -> list[NodeLaunch]:
        plugins = PluginSet(self.env)
        plugins.load_plugins()
        plugins.check_hooks()
        spawners = plugins.hooks.spawners(self.config())
        assert self.spawner in spawners, f"no plugin names a spawner {self.spawner!r}: {sorted(spawners)}"
        return list(spawners[self.spawner].launches(self.request()))

    def test_every_node_gets_its_detlaunch_word_for_word(self) -> None:
        request = self.request()
        launches = self.launches()
        assert launches and all(isinstance(launch, NodeLaunch) for launch in launches), launches
        for launch in launches:
            assert all(isinstance(word, str) for word in launch.argv), launch
            words = reached(launch, request)
            assert words is not None, (f"{launch.label}: {shlex.join(launch.argv)} does not run "
                                       f"{shlex.join(request.node_argv(launch.node))} word for word")
            shell = words != list(launch.argv)  # a remote shell's line: it must carry the cwd itself
            carried = words if shell else list(launch.argv)
            assert any(word.endswith(TRICKY_CWD) for word in carried) or TRICKY_CWD in carried, \
                f"{launch.label}: the working directory {TRICKY_CWD!r} is not given"

    def test_no_variable_is_on_a_command_line_and_each_reaches_the_node(self) -> None:
        """Any local user reads a command line (ps): a variable's value (a token) is never on one, but for the
        paths the node's interpreter reads as it starts (SpawnRequest.startup_argv: PYTHONPATH here), which must
        be. A launch that watches its stdin gets the others there, from detlaunch; any other in NodeLaunch.env."""
        request = self.request()
        for launch in self.launches():
            words = reached(launch, request) or []
            line = " ".join(launch.argv)
            for name, value in TRICKY_ENV.items():
                if launch.watches_stdin and name.startswith("PYTHON"):
                    assert f"{name}={value}" in words, f"{launch.label}: {name} is not set as its interpreter starts"
                elif launch.watches_stdin:
                    assert value not in line, f"{launch.label}: {name}'s value is on its command line"
                else:
                    assert value not in line and launch.env.get(name) == value, \
                        f"{launch.label}: {name} does not reach the node in its environment alone"

    def test_the_same_request_gives_the_same_launches_one_a_node(self) -> None:
        first, again = self.launches(), self.launches()
        assert first == again
        nodes = [launch.node for launch in first]
        assert len({launch.label for launch in first}) == len(first), "each launch needs a label of its own"
        if None not in nodes:
            assert sorted(n for n in nodes if n is not None) == list(range(len(self.hosts)))
        else:
            assert nodes == [None], "a launch for every node (node=None) is the only one"
