"""The layer contract suite (detlaunch.testing) against every layer we ship or publish, and tested itself.

Each layer takes the same three lines a third party writes. Then the suite's own tests: it runs,
in a separate pytest, against a toy layer that breaks one rule at a time (tests/support/plugin_fixtures/
toylayer.py), and must catch each one; a correct toy layer must pass all of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from detlaunch.testing import DetlaunchRunner, LayerContract, processes_with_marker
from support.helpers import free_port
from support.plugin_examples import JAX, MPIRUN, ensure_installed, fake_dist

ensure_installed(MPIRUN, JAX)  # now, before anything in this process lists entry points (see plugin_examples)


class TestTorchrun(LayerContract):
    layer = "torchrun"


class TestHorovod(LayerContract):
    layer = "horovod"


class TestDeepspeed(LayerContract):
    layer = "deepspeed"


class TestDirect(LayerContract):
    layer = "direct"


class TestMpirun(LayerContract):  # examples/detlaunch-mpirun, pip-installed like any third-party layer
    layer = "mpirun"


class TestJax(LayerContract):  # examples/detlaunch-jax: launcher-less, as a third party would write one
    layer = "jax"


def test_the_jax_example_plans_each_process_with_its_coordinator_variables(detlaunch_runner: DetlaunchRunner,
                                                                           tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import jax\n")
    port = str(free_port())
    args = ["--layer", "jax", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--master-port", port, "--dry-run"]
    run = detlaunch_runner.run(*args, "--node-rank", "1", "--format", "json", str(script), timeout=60)
    assert run.returncode == 0, run.output
    plan = json.loads(run.stdout)
    assert [(c["rank"], {k: v for k, v in c["env"].items() if k.startswith("JAX_")}) for c in plan["commands"]] == [
        (rank, {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "4",
                "JAX_PROCESS_ID": str(rank)}) for rank in (2, 3)]
    assert plan["rank_wrapper"][plan["rank_wrapper"].index("--rank-env") + 1] == "JAX_PROCESS_ID"
    text = detlaunch_runner.run(*args, "--node-rank", "0", str(script), timeout=60)
    assert "└── 2 rank(s) started by the supervisor itself, no launcher  [stop with SIGTERM]" in text.stdout
    assert "    ├── rank 1: JAX_PROCESS_ID=1" in text.stdout.splitlines(), text.stdout
    detlaunch_runner.assert_no_leftovers()


# -- the suite's own tests -------------------------------------------------------------------------

TOY_TESTS = """\
from detlaunch.testing import LayerContract


class TestToy(LayerContract):
    layer = "toy"
    heavy_modules = ("toy_heavy",)
    run_timeout = 60
"""


def run_suite(tmp_path: Path, mode: str, select: str = "", tests: str = TOY_TESTS,
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, tuple[str, str]]]:
    """Run the suite against the toy layer in TOY_MODE `mode`; return pytest's result and each test's
    (outcome, message). Processes the in-process planning leaked (mode "leak") are killed here."""
    (tmp_path / "test_toy.py").write_text(tests)
    report = tmp_path / "report.xml"
    marker = uuid.uuid4().hex
    toy = fake_dist(tmp_path / "site", "detlaunch-toy", {"detlaunch.layers": {"toy": "toylayer"}})
    env = {**os.environ, "TOY_MODE": mode, **toy, "TOY_META_MARKER": marker}
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--timeout", "120",
            f"--junitxml={report}", str(tmp_path / "test_toy.py")]
    if select:
        argv += ["-k", select]
    try:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
                              check=False, start_new_session=True)
    finally:
        for pid in processes_with_marker(f"TOY_META_MARKER={marker}"):
            os.kill(pid, signal.SIGKILL)
    outcomes: dict[str, tuple[str, str]] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for kind in ("failure", "error", "skipped"):
                found = case.find(kind)
                if found is not None:
                    outcome, message = kind, (found.get("message") or "") + (found.text or "")
            outcomes[case.get("name", "")] = (outcome, message)
    return done, outcomes


@pytest.mark.timeout(300)
def test_a_correct_layer_passes_the_whole_suite(real_processes: None, tmp_path: Path) -> None:
    done, outcomes = run_suite(tmp_path, "")
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = {n: m for n, (o, m) in outcomes.items() if o != "passed"}
    assert len(outcomes) == 26 and list(skipped) == ["test_real_two_node_job_without_a_launcher"], outcomes
    assert "declared by the layer: rank_commands = False (in the documented default)" in skipped[
        "test_real_two_node_job_without_a_launcher"]


@pytest.mark.timeout(300)
def test_a_correct_launcher_less_layer_passes_its_checks(real_processes: None, tmp_path: Path) -> None:
    done, outcomes = run_suite(tmp_path, "direct", "rank_commands or real or dry_run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(outcomes) == 11 and {o for o, _ in outcomes.values()} == {"passed"}, outcomes


BROKEN_RULES = [
    # (TOY_MODE, -k selection, the test that must fail, what its message must say)
    ("heavy", "heavy", "test_import_does_not_load_heavy_frameworks", "imported toy_heavy"),
    ("random", "well_formed and 1x1", "test_hooks_are_well_formed_and_deterministic[1x1-chief]",
     "differ between two identical calls"),
    ("no-wrapper", "well_formed and 1x8", "test_hooks_are_well_formed_and_deterministic[1x8-chief]",
     "never runs ctx.rank_command"),
    ("chief-ip", "chief_ip and 2x8-worker", "test_det_chief_ip_reaches_every_process_in_the_plan[2x8-worker]",
     "toy overrides DET_CHIEF_IP"),
    ("chief-ip", "real_two_rank", "test_real_two_rank_job_succeeds", "chief=192.0.2.1"),
    ("leak", "dry_run_renders_one_node", "test_dry_run_renders_one_node", "left running"),
    ("wrong-rank", "real_failing", "test_real_failing_rank_exit_code_comes_back", "expected rank 1's own exit code 7"),
    ("unknown-hook", "entry_point", "test_entry_point_loads_through_the_real_loader",
     "unknown hook(s) detlaunch_chief_stag"),
    ("direct-twice", "rank_commands and 1x8", "test_rank_commands_match_the_declaration[1x8-chief]",
     "rank 0 is started by 2 commands on node 0"),
    ("direct-twice", "well_formed and 2x8-worker", "test_hooks_are_well_formed_and_deterministic[2x8-worker]",
     "rank 8 is started by 2 commands on node 1"),
    ("direct-undeclared", "rank_commands and 1x1", "test_rank_commands_match_the_declaration[1x1-chief]",
     "does not declare rank_commands = True"),
    ("single-crash", "well_formed and 2x8-chief", "test_hooks_are_well_formed_and_deterministic[2x8-chief]",
     "ValueError"),
]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("mode", "select", "test", "says"), BROKEN_RULES,
                         ids=[f"{m}-{t.removeprefix('test_')[:30]}" for m, _, t, _ in BROKEN_RULES])
def test_the_suite_catches_a_broken_rule(real_processes: None, tmp_path: Path, mode: str, select: str, test: str,
                                         says: str) -> None:
    done, outcomes = run_suite(tmp_path, mode, select)
    assert test in outcomes, done.stdout + done.stderr
    outcome, message = outcomes[test]
    assert outcome in ("failure", "error"), f"{test} {outcome} with the toy layer in mode {mode}:\n{done.stdout}"
    assert says in message, message
    assert done.returncode == 1, done.stdout


@pytest.mark.timeout(200)
def test_declared_limits_are_checked_and_reported_never_silently_skipped(real_processes: None, tmp_path: Path) -> None:
    done, outcomes = run_suite(tmp_path, "single", "well_formed or dry_run_renders_two or chief_ip")
    assert done.returncode == 0, done.stdout + done.stderr
    declared = "declared by the layer: multi_node = False (in toylayer.DETLAUNCH_CONTRACT)"
    for name, (outcome, message) in outcomes.items():
        if "2x8" in name or "two_nodes" in name:
            assert outcome == "skipped" and declared in message, (name, outcome, message)
        else:
            assert outcome == "passed", (name, outcome, message)
    # The refusal itself was checked: planning 2 nodes fails with the layer's one-line error.
    assert "fails as it must: the toy layer runs on one node only" in \
        outcomes["test_hooks_are_well_formed_and_deterministic[2x8-worker]"][1]
    # ... and the end of the run lists what the declaration ruled out.
    section = done.stdout.partition("checks ruled out by a layer's declarations")[2].partition("short test summary")[0]
    skipped = [n for n, (o, _) in outcomes.items() if o == "skipped"]
    assert len(skipped) == 6 and section.count(declared) == 6, done.stdout
    assert all(f"TestToy::{name}: {declared}" in section for name in skipped), done.stdout


def test_a_test_class_attribute_overrides_the_layers_declaration(real_processes: None, tmp_path: Path) -> None:
    tests = TOY_TESTS + "    runs_here = False\n"
    done, outcomes = run_suite(tmp_path, "", "real_two_rank or real_failing", tests=tests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {n: o for n, (o, _) in outcomes.items()} == {
        "test_real_two_rank_job_succeeds": "skipped", "test_real_failing_rank_exit_code_comes_back": "skipped"}
    assert all("declared by the layer: runs_here = False (in the test class)" in m for _, m in outcomes.values())


def test_a_subclass_without_a_layer_is_a_clear_error_at_collection(real_processes: None, tmp_path: Path) -> None:
    tests = "from detlaunch.testing import LayerContract\n\n\nclass TestMine(LayerContract):\n    pass\n"
    done, outcomes = run_suite(tmp_path, "", tests=tests)
    assert done.returncode == 2, done.stdout  # a collection error
    assert "TypeError: test_toy.TestMine subclasses detlaunch.testing.LayerContract but sets no layer: " \
           "add `layer = \"NAME\"`" in done.stdout, done.stdout


def test_the_base_class_alone_is_not_collected(real_processes: None, tmp_path: Path) -> None:
    tests = textwrap.dedent("""\
        from detlaunch.testing import LayerContract


        class TestAbstract(LayerContract):  # an author's own base: abstract on purpose
            __test__ = False
            run_timeout = 30
        """)
    done, outcomes = run_suite(tmp_path, "", tests=tests)
    assert (done.returncode, outcomes) == (5, {}), done.stdout  # 5: no tests collected
