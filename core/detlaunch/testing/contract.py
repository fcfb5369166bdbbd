"""The layer contract suite: every check a launch layer must pass, for any layer.

A layer author writes three lines::

    from detlaunch.testing import LayerContract

    class TestMyLayer(LayerContract):
        layer = "mylayer"          # the name of its ``detlaunch.layers`` entry point

and pytest runs every ``test_*`` method below against the installed layer. The base
class is never collected on its own; a subclass without ``layer`` is an error as soon
as it is defined (so: at collection).

What a layer cannot do is declared, never skipped silently: see
:mod:`detlaunch.testing.capabilities` for each capability and its default. Only the checks
that start real processes take the ``runner`` fixture (and are marked as jobs by it); the
others plan in this process, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from detlaunch.errors import DetlaunchError
from detlaunch.planning.plan import LaunchPlan
from detlaunch.testing.capabilities import CAPABILITY_NAMES as CAPABILITY_NAMES
from detlaunch.testing.capabilities import Capabilities, resolve_capabilities
from detlaunch.testing.loaded_layer import LoadedLayer, clean_env, no_side_effects, normalized
from detlaunch.testing.plan_checks import contains, plan_problems, rank_command_problems, rank_commands
from detlaunch.testing.ports import free_port
from detlaunch.testing.runner import MARKER_VAR, Completed, DetlaunchRunner
from detlaunch.testing.shapes import CHIEF_ADDR, SHAPES, WORKER_ADDR, Shape

FAIL_CODE = 7  # what the failing rank exits with: it must come back unchanged

RANK_SCRIPT = textwrap.dedent("""\
    # Written by detlaunch's layer contract suite: a rank that needs nothing but Python.
    import os, sys, time
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran"), "a").close()
    names = [n for n in os.environ.get("CONTRACT_RANK_ENV", "").split(",") if n]
    rank = next((os.environ[n] for n in names if os.environ.get(n, "").strip().isdigit()), "?")
    print(f"contract rank={rank} chief={os.environ.get('DET_CHIEF_IP')} "
          f"marker={os.environ.get('%(marker)s')}", flush=True)
    if rank == os.environ.get("CONTRACT_FAIL_RANK"):
        print(f"contract rank {rank} fails on purpose", file=sys.stderr, flush=True)
        sys.exit(int(os.environ["CONTRACT_FAIL_CODE"]))
    if os.environ.get("CONTRACT_SLEEP"):
        time.sleep(float(os.environ["CONTRACT_SLEEP"]))
    """) % {"marker": MARKER_VAR}

IMPORT_PROBE = textwrap.dedent("""\
    import json, os, sys
    from detlaunch.planning.plugin_manager import PluginSet
    plugins = PluginSet(os.environ)
    plugins.load_layer(sys.argv[1])
    print(json.dumps({"layer_module": plugins.layer_module.__name__, "modules": sorted(sys.modules)}))
    """)


@dataclasses.dataclass
class Case:
    """One test's view of the layer under test."""

    layer: str
    loaded: LoadedLayer
    caps: Capabilities
    tmp: Path
    script: Path
    env: dict[str, str]

    def args(self, *extra: str, port: int | None = None) -> list[str]:
        """Options for this layer's runs (the in-process parse adds ``--layer`` itself)."""
        return ["--master-port", str(port or free_port()), *self.caps.run_args, *extra]

    def cli_args(self, *extra: str, port: int | None = None) -> list[str]:
        return ["--layer", self.layer, *self.args(*extra, port=port)]

    def plan(self, shape: Shape, port: int) -> LaunchPlan:
        config = self.loaded.config(self.args(str(self.script), port=port), self.env)
        return self.loaded.plan(config, shape.cluster())

    def rank_env(self) -> tuple[str, ...]:
        config = self.loaded.config(self.args(str(self.script)), self.env)
        plan = self.loaded.plan(config, Shape(1, 2, 0).cluster())
        wrappers = self.loaded.plugins.hooks.rank_wrappers(plan.context)
        return next((w.rank_env for w in wrappers if w.rank_env), ())


class LayerContract:
    """Subclass this with ``layer = "<name>"``: pytest then runs the whole contract against that layer.

    Capability attributes (None: the layer's ``DETLAUNCH_CONTRACT``, else the documented default;
    see :mod:`detlaunch.testing.capabilities`): ``multi_node``, ``runs_here``, ``needs``,
    ``heavy_modules``, ``run_args``, ``run_timeout``, ``rank_commands``. Setting ``__test__ = False`` in a subclass
    makes it an abstract base of your own, which needs no ``layer``.
    """

    __test__: ClassVar[bool] = False
    layer: ClassVar[str] = ""
    multi_node: ClassVar[bool | None] = None
    runs_here: ClassVar[bool | None] = None
    needs: ClassVar[Sequence[str] | None] = None
    heavy_modules: ClassVar[Sequence[str] | None] = None
    run_args: ClassVar[Sequence[str] | None] = None
    run_timeout: ClassVar[float | None] = None
    rank_commands: ClassVar[bool | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("__test__") is False:
            return  # an abstract base of the suite, not a layer's tests
        if not isinstance(cls.layer, str) or not cls.layer:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} subclasses detlaunch.testing.LayerContract but "
                            "sets no layer: add `layer = \"NAME\"`, the name of the layer's `detlaunch.layers` "
                            "entry point (or set `__test__ = False` to make it an abstract base)")
        cls.__test__ = True

    # -- fixtures --------------------------------------------------------------------------------

    @pytest.fixture
    def contract(self, tmp_path: Path) -> Case:
        env = clean_env(os.environ)
        env.update(TMPDIR=str(tmp_path / "tmp"), XDG_CACHE_HOME=str(tmp_path / "cache"))
        loaded = LoadedLayer.load(self.layer, env)
        overrides = {name: getattr(type(self), name) for name in CAPABILITY_NAMES}
        caps = resolve_capabilities(loaded.module, overrides)
        script = tmp_path / "contract_rank.py"
        script.write_text(RANK_SCRIPT)
        return Case(self.layer, loaded, caps, tmp_path, script, env)

    @pytest.fixture
    def runner(self, detlaunch_runner: DetlaunchRunner) -> DetlaunchRunner:
        """The checks that start real processes take this one (and only they: the others run in milliseconds)."""
        # The real runs of this test must not depend on an outer job either (pytest under detlaunch).
        marker = detlaunch_runner.env[MARKER_VAR]
        detlaunch_runner.env = {**clean_env(detlaunch_runner.env), MARKER_VAR: marker}
        return detlaunch_runner

    def _multi_node_or_skip(self, case: Case) -> None:
        if not case.caps.multi_node:
            pytest.skip(f"{case.caps.declared('multi_node')}: the 2-node checks do not apply")

    def _real_runs_or_skip(self, case: Case) -> None:
        if not case.caps.runs_here:
            pytest.skip(f"{case.caps.declared('runs_here')}: no real job is run")
        path = case.env.get("PATH", os.defpath)
        missing = [prog for prog in case.caps.needs if shutil.which(prog, path=path) is None]
        if missing:
            pytest.skip(f"{case.caps.declared('needs')}: {', '.join(missing)} not found on PATH; "
                        "no real job is run")

    # -- loading ---------------------------------------------------------------------------------

    def test_entry_point_loads_through_the_real_loader(self, contract: Case) -> None:
        entry = contract.loaded.entry
        assert entry.status == "loaded", entry
        assert entry.dist not in ("", "?") and entry.version not in ("", "?"), (
            f"{entry.target}: no distribution owns this entry point")
        hooks = {impl.function.__name__ for caller in contract.loaded.plugins.pm.get_hookcallers(contract.loaded.module)
                 or [] for impl in caller.get_hookimpls() if impl.plugin is contract.loaded.module}
        assert "detlaunch_chief_stage" in hooks, f"the layer implements no detlaunch_chief_stage (it has: {hooks})"
        contract.loaded.plugins.pm.check_pending()  # no hook implementation without a spec

    def test_listed_by_detlaunch_layers(self, contract: Case, runner: DetlaunchRunner) -> None:
        run = runner.run("layers", "--format", "json", timeout=60)
        assert run.returncode == 0, run.output
        mine = [e for e in json.loads(run.stdout) if e["name"] == self.layer and e["status"] != "shadowed"]
        assert len(mine) == 1, run.output
        assert (mine[0]["status"], mine[0]["dist"], mine[0]["version"]) == (
            "loaded", contract.loaded.entry.dist, contract.loaded.entry.version), mine[0]
        runner.assert_no_leftovers()

    def test_import_does_not_load_heavy_frameworks(self, contract: Case, runner: DetlaunchRunner) -> None:
        """A fresh interpreter (a real process: `runner`) loads the layer through its entry point; no heavy
        module may come along."""
        done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, self.layer], env=contract.env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.splitlines()[-1])
        assert report["layer_module"] == contract.loaded.module.__name__
        heavy = sorted(m for m in report["modules"]
                       if any(m == h or m.startswith(h + ".") for h in contract.caps.heavy_modules))
        assert not heavy, (f"loading layer {self.layer!r} imported {', '.join(heavy[:10])}: import heavy "
                           "frameworks inside the rank, not in the layer module "
                           f"(checked: {', '.join(contract.caps.heavy_modules)})")

    # -- planning: hooks, in this process ---------------------------------------------------------

    @pytest.mark.parametrize("shape", SHAPES, ids=[s.id for s in SHAPES])
    def test_hooks_are_well_formed_and_deterministic(self, contract: Case, shape: Shape) -> None:
        port = free_port()
        if shape.nodes > 1 and not contract.caps.multi_node:
            with pytest.raises(DetlaunchError) as refused:
                contract.plan(shape, port)
            message = str(refused.value)
            assert message and "\n" not in message, f"the refusal must be one line: {message!r}"
            pytest.skip(f"{contract.caps.declared('multi_node')}; planning {shape.id} fails as it must: {message}")
        hooks = contract.loaded.plugins.hooks
        shared = os.path.join(contract.env["XDG_CACHE_HOME"], "detlaunch")
        with no_side_effects([shared, contract.env["TMPDIR"]]) as side_effects:
            plan = contract.plan(shape, port)
            again = contract.plan(shape, port)
            ctx = plan.context
            wrappers = hooks.rank_wrappers(ctx)
            layer_env = contract.loaded.own_results("detlaunch_environment", ctx=ctx)
            stage_hook = hooks.chief_stage if shape.node_rank == 0 else hooks.worker_stage
            stage_1, stage_2 = stage_hook(ctx), stage_hook(ctx)
            same_calls = (wrappers == hooks.rank_wrappers(ctx), hooks.environment(ctx) == hooks.environment(ctx))
        side_effects += [f"{path} exists after planning" for path in (plan.run_dir, again.run_dir)
                         if os.path.lexists(path)]
        assert not side_effects, "building a plan must not start anything or touch the disk:\n" + \
            "\n".join(side_effects)
        assert (plan.role, plan.cluster.node_rank) == ("chief" if shape.node_rank == 0 else "worker", shape.node_rank)
        problems = plan_problems(plan, wrappers, {k: v for r in layer_env for k, v in r.items()} if layer_env
                                 else None)
        assert not problems, f"{shape.id}: the {plan.role} plan is not well formed:\n- " + "\n- ".join(problems)
        assert stage_1 == stage_2 == plan.stage, f"{shape.id}: the same context gave different stages"
        assert all(same_calls), f"{shape.id}: rank_wrappers/environment differ between two identical calls"
        assert normalized(plan) == normalized(again), f"{shape.id}: two plans of the same input differ"
        assert plan.rank_command[-len(plan.user_command):] == plan.user_command
        assert plan.rank_command[: len(plan.wrapper_argv)] == plan.wrapper_argv

    def test_preflight_checks_are_well_formed(self, contract: Case) -> None:
        """The layer's own ``detlaunch_preflight_checks`` (if any): PreflightChecks with a name of their own and
        a callable run, the same list twice. They are listed, not run (a run may need the layer's framework)."""
        from detlaunch.planning.preflight import BUILT_IN_NAMES, PreflightCheck

        config = contract.loaded.config(contract.args(str(contract.script)), contract.env)
        first = contract.loaded.own_results("detlaunch_preflight_checks", config=config)
        again = contract.loaded.own_results("detlaunch_preflight_checks", config=config)
        checks = [c for result in first for c in result]
        assert all(isinstance(result, list) for result in first), "return a list of detlaunch.PreflightCheck, or None"
        problems = [f"{c!r} is no detlaunch.PreflightCheck" for c in checks if not isinstance(c, PreflightCheck)]
        named = [c for c in checks if isinstance(c, PreflightCheck)]
        problems += [f"{c.name!r}: its run is not callable" for c in named if not callable(c.run)]
        names = [c.name for c in named]
        problems += [f"{n!r}: named twice, or a built-in check's name" for n in set(names)
                     if not n or names.count(n) > 1 or n in BUILT_IN_NAMES]
        assert not problems, "preflight checks:\n- " + "\n- ".join(problems)
        assert [[c.name for c in r] for r in first] == [[c.name for c in r] for r in again], \
            "two calls gave different checks"

    @pytest.mark.parametrize("shape", SHAPES, ids=[s.id for s in SHAPES])
    def test_det_chief_ip_reaches_every_process_in_the_plan(self, contract: Case, shape: Shape) -> None:
        if shape.nodes > 1:
            self._multi_node_or_skip(contract)
        plan = contract.plan(shape, free_port())
        assert plan.env.get("DET_CHIEF_IP") == CHIEF_ADDR, plan.env
        assert "DET_CHIEF_IP" not in plan.unset_env
        for cmd in plan.stage.commands:
            assert cmd.env.get("DET_CHIEF_IP", CHIEF_ADDR) == CHIEF_ADDR, f"{cmd.name} overrides DET_CHIEF_IP"

    @pytest.mark.parametrize("node_rank", [0, 1], ids=["chief", "worker"])
    def test_the_plan_follows_a_node_that_moved(self, contract: Case, node_rank: int) -> None:
        """A spare takes node 1's place at another address (docs/RESTARTS.md): each node's part is planned from
        the cluster as it now is (the chief's again, the spare's as node 1), so where the plan named node 1's old
        address it names the new one, and the old one nowhere."""
        self._multi_node_or_skip(contract)
        shape, port, moved_to = Shape(2, 8, node_rank), free_port(), "127.0.0.9"
        config = contract.loaded.config(contract.args(str(contract.script), port=port), contract.env)
        before = repr(contract.loaded.plan(config, shape.cluster()).stage)
        moved = dataclasses.replace(shape.cluster(), node_addrs=(CHIEF_ADDR, moved_to))
        after = repr(contract.loaded.plan(config, moved).stage)
        assert WORKER_ADDR not in after, f"{shape.id}: node 1 moved to {moved_to}, the plan still names {WORKER_ADDR}"
        assert (WORKER_ADDR in before) == (moved_to in after), f"{shape.id}: node 1's new address is not in the plan"

    @pytest.mark.parametrize("place", [0, 2], ids=["chief", "worker"])
    def test_the_plan_follows_a_job_that_shrank(self, contract: Case, place: int) -> None:
        """--nnodes MIN:MAX (docs/RESTARTS.md): of three nodes, node 1 is lost and no spare takes its place, so
        the next attempt runs on nodes 0 and 2, node 2 now node rank 1: each plans from that cluster (two nodes,
        ranks renumbered), and the lost node's address is nowhere in the plan."""
        from detlaunch.planning import membership

        self._multi_node_or_skip(contract)
        lost_addr, third = WORKER_ADDR, "127.0.0.3"
        base = dataclasses.replace(Shape(2, 8, 0).cluster(), node_addrs=(CHIEF_ADDR, lost_addr, third),
                                   slots=(8, 8, 8), node_rank=place)
        shrunk = membership.cluster_of(base, (0, 2), place)
        config = contract.loaded.config(contract.args(str(contract.script), port=free_port()), contract.env)
        plan = contract.loaded.plan(config, shrunk)
        assert (plan.cluster.num_nodes, plan.cluster.node_rank, plan.cluster.total_slots) == (2, place // 2, 16)
        wrappers = contract.loaded.plugins.hooks.rank_wrappers(plan.context)
        problems = plan_problems(plan, wrappers, None)
        assert not problems, f"the {plan.role} plan of a shrunk job is not well formed:\n- " + "\n- ".join(problems)
        assert lost_addr not in repr(plan.stage), f"node 1 ({lost_addr}) was dropped, the plan still names it"

    @pytest.mark.parametrize("shape", SHAPES, ids=[s.id for s in SHAPES])
    def test_rank_commands_match_the_declaration(self, contract: Case, shape: Shape) -> None:
        """A launcher-less layer (rank_commands) starts each of the node's ranks itself, once; others none."""
        if shape.nodes > 1:
            self._multi_node_or_skip(contract)
        plan = contract.plan(shape, free_port())
        commands = rank_commands(plan.stage)
        c = plan.cluster
        if not contract.caps.rank_commands:
            assert not commands, (f"{shape.id}: the stage starts ranks itself ({', '.join(x.name for x in commands)}: "
                                  "Command(rank=...)), but the layer does not declare rank_commands = True "
                                  "(add it to DETLAUNCH_CONTRACT)")
            return
        wrappers = contract.loaded.plugins.hooks.rank_wrappers(plan.context)
        problems = rank_command_problems(plan, wrappers)
        launchers = [x.name for x in plan.stage.commands if x.rank is None and not x.daemon]
        if launchers:
            problems.append(f"a layer that starts its ranks itself runs no launcher, but this stage also runs "
                            f"{', '.join(launchers)}")
        if sorted(x.rank or 0 for x in commands) != list(range(c.first_rank, c.first_rank + c.local_slots)):
            problems.append(f"node {c.node_rank} must start each of its ranks {c.first_rank}.."
                            f"{c.first_rank + c.local_slots - 1} itself, once; it starts {[x.rank for x in commands]}")
        assert not problems, f"{shape.id}: " + "\n- ".join(["the ranks the stage starts itself:", *problems])

    # -- planning: the real command line ---------------------------------------------------------

    def _dry_run(self, case: Case, runner: DetlaunchRunner, shape_args: Sequence[str]) -> tuple[dict[str, Any], str]:
        port = free_port()
        args = case.cli_args(*shape_args, "--job-id", "contract-dry-run", "--dry-run", port=port)
        as_json = runner.run(*args, "--format", "json", str(case.script), timeout=60)
        assert as_json.returncode == 0 and only_warnings(as_json.stderr), as_json.output
        as_text = runner.run(*args, str(case.script), timeout=60)
        assert as_text.returncode == 0 and only_warnings(as_text.stderr), as_text.output
        assert not (case.tmp / "ran").exists()
        assert not list(runner.tmpdir.iterdir()), f"--dry-run created {list(runner.tmpdir.iterdir())}"
        assert not (runner.cache / "detlaunch").exists(), "--dry-run created the shared job directory"
        runner.assert_no_leftovers()
        return json.loads(as_json.stdout), as_text.stdout

    def _check_rendered(self, plan: dict[str, Any], text: str, role: str, slots: list[int]) -> None:
        """The JSON says what this node runs; the tree shows the same."""
        chief = plan["cluster"]["chief_addr"]
        assert (plan["layer"], plan["role"], plan["cluster"]["slots"]) == (self.layer, role, slots), plan
        assert plan["env"].get("DET_CHIEF_IP") == chief, plan["env"]
        assert plan["command"][-1].endswith("contract_rank.py"), plan["command"]
        assert plan["commands"], "the plan runs nothing"
        rank_command = plan["rank_wrapper"] + plan["command"]
        in_argv = any(contains(c["argv"], rank_command) for c in plan["commands"])
        if role == "chief":
            assert in_argv or plan["files"], f"nothing in the chief's plan runs the rank command {rank_command}"
        lines = text.splitlines()
        assert lines and f"({role}) · layer {self.layer} · " in lines[0], text
        assert "environment added for every process:" in lines, text
        assert f"  DET_CHIEF_IP={chief}" in lines, text
        for cmd in plan["commands"]:
            assert any(shlex.quote(cmd["argv"][0]) in line for line in lines), f"{cmd['name']} not shown:\n{text}"
        if in_argv:  # the tree shows the wrapper, then the user's command, under the launcher
            assert any(line.endswith(f"{shlex.join(plan['rank_wrapper'])}  [one per rank]") for line in lines), text
            assert any(line.endswith(f"└── {shlex.join(plan['command'])}") for line in lines), text

    def test_dry_run_renders_one_node(self, contract: Case, runner: DetlaunchRunner) -> None:
        plan, text = self._dry_run(contract, runner, ["--nproc-per-node", "2"])
        self._check_rendered(plan, text, "chief", [2])

    @pytest.mark.parametrize("node_rank", [0, 1], ids=["chief", "worker"])
    def test_dry_run_renders_two_nodes(self, contract: Case, runner: DetlaunchRunner,
                                       node_rank: int) -> None:
        self._multi_node_or_skip(contract)
        hosts = f"{CHIEF_ADDR}:2,{WORKER_ADDR}:2"
        plan, text = self._dry_run(contract, runner, ["--hosts", hosts, "--node-rank", str(node_rank)])
        self._check_rendered(plan, text, "worker" if node_rank else "chief", [2, 2])
        assert plan["cluster"]["node_rank"] == node_rank

    # -- real jobs -------------------------------------------------------------------------------

    def _run_job(self, case: Case, runner: DetlaunchRunner, **env: str) -> Completed:
        rank_env = ",".join(case.rank_env())
        run = runner.run(*case.cli_args("--nproc-per-node", "2", str(case.script)),
                         env={"CONTRACT_RANK_ENV": rank_env, **env}, timeout=case.caps.run_timeout)
        runner.assert_no_leftovers()
        return run

    def test_real_two_rank_job_succeeds(self, contract: Case, runner: DetlaunchRunner) -> None:
        self._real_runs_or_skip(contract)
        run = self._run_job(contract, runner)
        assert run.returncode == 0, run.output
        for rank in (0, 1):
            expected = f"contract rank={rank} chief={CHIEF_ADDR} marker={runner.marker_value}"
            assert contract_lines(run, rank) == [expected], \
                f"rank {rank} did not run once, with DET_CHIEF_IP and the job's environment:\n{run.output}"

    def test_real_failing_rank_exit_code_comes_back(self, contract: Case, runner: DetlaunchRunner) -> None:
        self._real_runs_or_skip(contract)
        sleep = contract.caps.run_timeout * 2  # the other rank would outlive the test unless stopped
        run = self._run_job(contract, runner, CONTRACT_FAIL_RANK="1", CONTRACT_FAIL_CODE=str(FAIL_CODE),
                            CONTRACT_SLEEP=f"{sleep:g}")
        assert run.returncode == FAIL_CODE, f"expected rank 1's own exit code {FAIL_CODE}:\n{run.output}"
        assert re.search(rf"^detlaunch: job failed: rank 1 on node 0 .*exited with code {FAIL_CODE}$",
                         run.stderr, re.M), run.output


    def test_real_two_node_job_without_a_launcher(self, contract: Case, runner: DetlaunchRunner) -> None:
        """rank_commands: a real 2 x 1 job on 127.0.0.1 and 127.0.0.2 with the job link as the only
        coordination: each rank runs once, then rank 1 (on node 1) fails and both nodes exit with its code."""
        if not contract.caps.rank_commands:
            pytest.skip(f"{contract.caps.declared('rank_commands')}: a launcher that needs ssh or a scheduler "
                        "to reach a second node is not run here")
        self._multi_node_or_skip(contract)
        self._real_runs_or_skip(contract)
        env = {"CONTRACT_RANK_ENV": ",".join(contract.rank_env())}
        failing = {**env, "CONTRACT_FAIL_RANK": "1", "CONTRACT_FAIL_CODE": str(FAIL_CODE),
                   "CONTRACT_SLEEP": f"{contract.caps.run_timeout * 2:g}"}
        for run_env, codes in ((env, [0, 0]), (failing, [FAIL_CODE, FAIL_CODE])):
            port = free_port()
            hosts = f"{CHIEF_ADDR}:1,{WORKER_ADDR}:1"
            nodes = [runner.start(*contract.cli_args("--hosts", hosts, "--node-rank", str(n),
                                                               str(contract.script), port=port), env=run_env)
                     for n in (1, 0)]
            worker, chief = (node.wait(contract.caps.run_timeout) for node in nodes)
            runner.assert_no_leftovers()
            assert [chief.returncode, worker.returncode] == codes, chief.output + "\n" + worker.output
            if codes == [0, 0]:
                for rank, run in ((0, chief), (1, worker)):
                    expected = f"contract rank={rank} chief={CHIEF_ADDR} marker={runner.marker_value}"
                    assert contract_lines(run, rank) == [expected], run.output
            else:
                for run in (chief, worker):
                    assert re.search(rf"^detlaunch: job failed: rank 1 on node 1 .*exited with code {FAIL_CODE}$",
                                     run.stderr, re.M), run.output


def only_warnings(stderr: str) -> bool:
    """A --dry-run may warn (one line each); anything else on stderr is a failure."""
    return all(line.startswith("detlaunch: warning: ") for line in stderr.splitlines())


def contract_lines(run: Completed, rank: int) -> list[str]:
    return [line for line in run.rank_lines(rank) if line.startswith("contract rank=")]
