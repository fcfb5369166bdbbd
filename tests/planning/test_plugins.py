"""Plugins as a user installs them: listing, load isolation, DETLAUNCH_DISABLE_PLUGINS, observers,
and the third-party mpirun layer (examples/detlaunch-mpirun) running real jobs.

examples/detlaunch-mpirun and examples/detlaunch-broken are pip-installed for the run (a folder of its
own on PYTHONPATH, tests/support/plugin_examples.py: the venv is left alone); other plugins are
distributions made of a dist-info folder on the PYTHONPATH of one detlaunch run only
(tests/support/plugin_fixtures/), so they never leak into another test.
"""

from __future__ import annotations

import importlib.metadata
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from detlaunch.testing import DetlaunchRunner
from support import paths
from support.plugin_examples import BROKEN, MPIRUN, ensure_installed, fake_dist

ensure_installed(MPIRUN, BROKEN)  # now, before anything in this process lists entry points

pytestmark = pytest.mark.timeout(120)
SCRIPTS = paths.SCRIPTS
RANKS = str(SCRIPTS / "ranks.py")
BROKEN_ERROR = "RuntimeError: detlaunch-broken fails to import on purpose (examples/detlaunch-broken)"
BUILTIN_PLUGINS = ("determined", "kubernetes", "local", "slurm", "static")


def listing(runner: DetlaunchRunner, which: str = "layers", env: dict[str, str] | None = None,
            ) -> list[dict[str, str]]:
    run = runner.run(which, "--format", "json", env=env, timeout=60)
    assert (run.returncode, run.stderr) == (0, ""), run.output
    entries: list[dict[str, str]] = json.loads(run.stdout)
    return entries


def by_name(entries: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {e["name"]: e for e in entries if e["status"] != "shadowed"}


def test_json_listing_however_it_is_asked_for(detlaunch_runner: DetlaunchRunner) -> None:
    expected = listing(detlaunch_runner, "plugins")
    for args, env in ((["--format=json"], None), ([], {"DETLAUNCH_FORMAT": "json"})):
        run = detlaunch_runner.run("plugins", *args, env=env, timeout=60)
        assert (run.returncode, run.stderr) == (0, ""), run.output
        assert json.loads(run.stdout) == expected, (args, env)
    # the flag wins over the variable, as everywhere; a bare word "json" is no flag
    run = detlaunch_runner.run("plugins", "--format", "text", env={"DETLAUNCH_FORMAT": "json"}, timeout=60)
    assert run.stdout.startswith("layer "), run.output
    run = detlaunch_runner.run("plugins", "--layer", "json", timeout=60)
    assert run.stdout.startswith("layer "), run.output


# -- detlaunch layers / detlaunch plugins ----------------------------------------------------------


def test_layers_shows_every_installed_layer_its_distribution_and_whether_it_loaded(
        detlaunch_runner: DetlaunchRunner) -> None:
    installed = {ep.name: ep for ep in importlib.metadata.entry_points(group="detlaunch.layers")}
    assert {"torchrun", "horovod", "deepspeed", "mpirun", "broken"} <= set(installed)
    text = detlaunch_runner.run("layers", timeout=60)
    assert (text.returncode, text.stderr) == (0, ""), text.output
    lines = text.stdout.splitlines()
    assert len(lines) == len(installed), text.stdout
    for name, ep in installed.items():
        dist = ep.dist
        assert dist is not None
        status = f"failed: {BROKEN_ERROR}" if name == "broken" else "loaded"
        expected = f"{name} {dist.name} {dist.version} ({ep.value}) {status}"
        assert [line for line in lines if " ".join(line.split()[1:]) == expected and line.startswith("layer ")], \
            f"no line `layer {expected}` in:\n{text.stdout}"
    as_json = by_name(listing(detlaunch_runner))
    assert as_json["mpirun"] == {"group": "detlaunch.layers", "name": "mpirun", "target": "detlaunch_mpirun.layer",
                                 "dist": "detlaunch-mpirun", "version": "0.1.0", "status": "loaded", "error": ""}
    assert (as_json["broken"]["status"], as_json["broken"]["error"]) == ("failed", BROKEN_ERROR)
    assert {as_json[n]["status"] for n in ("torchrun", "horovod", "deepspeed")} == {"loaded"}


def test_plugins_shows_layers_and_always_on_plugins(detlaunch_runner: DetlaunchRunner) -> None:
    entries = listing(detlaunch_runner, "plugins")
    plugins = {e["name"]: e for e in entries if e["group"] == "detlaunch.plugins"}
    assert set(BUILTIN_PLUGINS) <= set(plugins)
    for name in BUILTIN_PLUGINS:
        assert (plugins[name]["dist"], plugins[name]["version"], plugins[name]["status"]) == (
            "detlaunch", "0.1.0", "loaded"), plugins[name]
    assert {"mpirun", "broken"} <= {e["name"] for e in entries if e["group"] == "detlaunch.layers"}


def test_debug_shows_the_traceback_of_a_layer_that_failed(detlaunch_runner: DetlaunchRunner) -> None:
    run = detlaunch_runner.run("layers", "--debug", timeout=60)
    assert run.returncode == 0, run.output
    after = run.stdout.split(f"failed: {BROKEN_ERROR}\n", 1)[1]
    assert after.startswith("    Traceback (most recent call last):"), run.stdout
    assert "detlaunch_broken/layer.py" in after


# -- isolation: the broken layer breaks nothing else -------------------------------------------------


def test_a_broken_layer_breaks_no_other_layer(detlaunch_runner: DetlaunchRunner, tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from', os.environ['OMPI_COMM_WORLD_RANK'])\n")
    run = detlaunch_runner.run("--layer", "mpirun", "--nproc-per-node", "2", str(script), timeout=90)
    assert run.returncode == 0, run.output
    assert (run.rank_lines(0), run.rank_lines(1)) == (["hello from 0"], ["hello from 1"]), run.output
    dry = detlaunch_runner.run("--layer", "torchrun", "--dry-run", str(script), timeout=60)
    assert (dry.returncode, dry.stderr) == (0, ""), dry.output
    assert "torch.distributed.run" in dry.stdout


def test_choosing_the_broken_layer_fails_with_one_clear_line(detlaunch_runner: DetlaunchRunner,
                                                             tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('never')\n")
    run = detlaunch_runner.run("--layer", "broken", str(script), timeout=60)
    assert (run.returncode, run.stdout) == (1, ""), run.output
    assert run.stderr.splitlines() == [
        f"detlaunch: error: layer 'broken' (detlaunch_broken.layer, from detlaunch-broken 0.1.0) failed to load: "
        f"{BROKEN_ERROR}"], run.output


def test_disabled_plugins_are_never_imported(detlaunch_runner: DetlaunchRunner, tmp_path: Path) -> None:
    log = tmp_path / "imports.log"
    trace = {"DETLAUNCH_BROKEN_IMPORT_LOG": str(log)}
    assert by_name(listing(detlaunch_runner, env=trace))["broken"]["status"] == "failed"
    assert log.read_text().count("imported by pid") == 1  # the trace works: listing imported it once

    off = {**trace, "DETLAUNCH_DISABLE_PLUGINS": "broken"}
    shown = by_name(listing(detlaunch_runner, env=off))["broken"]
    assert (shown["status"], shown["error"]) == ("disabled", ""), shown
    script = tmp_path / "hello.py"
    script.write_text("print('never')\n")
    run = detlaunch_runner.run("--layer", "broken", str(script), env=off, timeout=60)
    assert (run.returncode, run.stderr) == (
        1, "detlaunch: error: layer 'broken' is disabled by DETLAUNCH_DISABLE_PLUGINS\n"), run.output
    assert log.read_text().count("imported by pid") == 1, "a disabled plugin was imported"


def test_disabled_builtin_layers_and_plugins_are_never_imported(real_processes: None, tmp_path: Path) -> None:
    """The listing imports every other layer and plugin; the disabled ones stay out of sys.modules."""
    probe = textwrap.dedent("""\
        import contextlib, io, json, os, sys
        from detlaunch.cli.main import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["plugins"], dict(os.environ, DETLAUNCH_DISABLE_PLUGINS="torchrun,determined"))
        wanted = ["detlaunch_torchrun.layer", "detlaunch.planning.providers.determined", "detlaunch_horovod.layer",
                  "detlaunch.planning.providers.slurm"]
        print(json.dumps({"code": code, "imported": {m: m in sys.modules for m in wanted}, "out": out.getvalue()}))
        """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["code"] == 0
    assert result["imported"] == {"detlaunch_torchrun.layer": False, "detlaunch.planning.providers.determined": False,
                                  "detlaunch_horovod.layer": True, "detlaunch.planning.providers.slurm": True}
    lines = result["out"].splitlines()
    assert any(line.split()[:2] == ["layer", "torchrun"] and line.endswith(" disabled") for line in lines)
    assert any(line.split()[:2] == ["plugin", "determined"] and line.endswith(" disabled") for line in lines)


def test_a_failing_always_on_plugin_is_reported_and_the_job_goes_on(detlaunch_runner: DetlaunchRunner,
                                                                    tmp_path: Path) -> None:
    env = fake_dist(tmp_path / "site", "toy-plugins", {"detlaunch.plugins": {
        "flaky": "toy_broken_plugin", "typo": "toy_typo_plugin"}})
    log = tmp_path / "flaky.log"
    env["TOY_BROKEN_PLUGIN_LOG"] = str(log)
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    run = detlaunch_runner.run("--layer", "torchrun", "--dry-run", str(script), env=env, timeout=60)
    assert run.returncode == 0 and "torch.distributed.run" in run.stdout, run.output
    assert run.stderr.splitlines() == [
        "detlaunch: warning: plugin 'flaky' (toy-plugins 0.1) failed to load and is skipped: ImportError: "
        "toy_broken_plugin cannot be imported, on purpose (DETLAUNCH_DISABLE_PLUGINS=flaky silences this)",
        "detlaunch: warning: plugin 'typo' (toy-plugins 0.1) failed to load and is skipped: unknown hook(s) "
        "detlaunch_job_finishd: not in detlaunch's hook specs (see docs/HOOKS.md) "
        "(DETLAUNCH_DISABLE_PLUGINS=typo silences this)"], run.output
    shown = by_name(listing(detlaunch_runner, "plugins", env=env))
    assert (shown["flaky"]["status"], shown["typo"]["status"]) == ("failed", "failed")
    assert {shown[n]["status"] for n in (*BUILTIN_PLUGINS, "torchrun", "mpirun")} == {"loaded"}
    assert log.read_text() == "imported\nimported\n"

    env["DETLAUNCH_DISABLE_PLUGINS"] = "flaky,typo"
    quiet = detlaunch_runner.run("--layer", "torchrun", "--dry-run", str(script), env=env, timeout=60)
    assert (quiet.returncode, quiet.stderr) == (0, ""), quiet.output
    assert log.read_text() == "imported\nimported\n", "a disabled plugin was imported"


def test_a_layer_published_under_a_builtin_name_does_not_replace_it(detlaunch_runner: DetlaunchRunner,
                                                                    tmp_path: Path) -> None:
    env = fake_dist(tmp_path / "site", "toy-shadow", {"detlaunch.layers": {"torchrun": "toy_shadow"}})
    log = tmp_path / "shadow.log"
    env["TOY_SHADOW_LOG"] = str(log)
    torchruns = [e for e in listing(detlaunch_runner, env=env) if e["name"] == "torchrun"]
    assert [(e["dist"], e["status"]) for e in torchruns] == [("detlaunch", "loaded"), ("toy-shadow", "shadowed")]
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    run = detlaunch_runner.run("--layer", "torchrun", "--dry-run", str(script), env=env, timeout=60)
    assert run.returncode == 0 and "torch.distributed.run" in run.stdout, run.output
    assert not log.exists(), "the shadowed layer was imported"
    probe = "import toy_shadow"  # the trace works: importing it does leave the line
    subprocess.run([sys.executable, "-c", probe], env={**detlaunch_runner.env, **env}, check=True, timeout=60)
    assert log.read_text() == "imported\n"


# -- observers and options from an always-on plugin ------------------------------------------------------


def test_observers_see_the_job_and_cannot_change_its_exit_code(detlaunch_runner: DetlaunchRunner,
                                                               tmp_path: Path) -> None:
    env = fake_dist(tmp_path / "site", "toy-observer", {"detlaunch.plugins": {"observer": "toy_observer"}})
    log, events = tmp_path / "observer.log", tmp_path / "events.log"
    env.update(TOY_OBSERVER_LOG=str(log), TOY_OBSERVER_RAISE="1", FAIL_RANK="1", FAIL_CODE="7",
               TOY_OBSERVER_EVENTS=str(events))
    helped = detlaunch_runner.run("--layer", "mpirun", "--help", env=env, timeout=60)
    assert "--toy-tag TOY_TAG" in helped.stdout, helped.output  # detlaunch_add_options, from a plugin

    dry = detlaunch_runner.run("--layer", "mpirun", "--dry-run", RANKS, env=env, timeout=60)
    assert dry.returncode == 0 and not log.exists() and not events.exists(), "a --dry-run must call no observer"

    run = detlaunch_runner.run("--layer", "mpirun", "--nproc-per-node", "2", "--toy-tag", "blue", RANKS,
                               env=env, timeout=90)
    assert run.returncode == 7, run.output
    assert "detlaunch: warning: a job_finished observer failed: detlaunch.plugins:observer: RuntimeError: " \
           "the toy observer fails on purpose" in run.stderr, run.output
    started, finished = [json.loads(line) for line in log.read_text().splitlines()]
    assert (started["hook"], started["commands"], started["tag"]) == ("job_started", ["mpirun"], "blue")
    assert {k: finished[k] for k in ("hook", "exit_code", "ranks", "root_cause_rank", "tag")} == {
        "hook": "job_finished", "exit_code": 7, "ranks": [0, 1], "root_cause_rank": 1, "tag": "blue"}
    seen = [json.loads(line) for line in events.read_text().splitlines()]  # detlaunch_event, as they happened
    assert seen[0]["kind"] == "job_planned" and seen[-1]["kind"] == "job_finished", seen
    assert seen[-1]["details"]["exit_code"] == 7
    assert {"kind": "rank_exited", "rank": 1} in [{k: e[k] for k in ("kind", "rank")} for e in seen]
    assert run.stderr.count("detlaunch_event failed: RuntimeError: the toy event observer fails on purpose") == 1


# -- the mpirun layer: what its stop signal must get right ---------------------------------------------


def test_mpirun_ctrl_c_stops_every_rank_and_leaves_nothing(detlaunch_runner: DetlaunchRunner) -> None:
    """detlaunch gives SIGINT to the ranks, then SIGTERM to mpirun, which then ends at once and removes
    its session folder (SIGKILL would leave the folder in TMPDIR and orphan what it started)."""
    job = detlaunch_runner.start("--layer", "mpirun", "--nproc-per-node", "2", RANKS, env={"SLEEP": "100"})
    for rank in (0, 1):
        job.wait_for_output(f"[rank={rank}] rank {rank} sleeping")
    job.send_signal(signal.SIGINT)
    run = job.wait(60)
    assert run.returncode == 130, run.output
    for rank in (0, 1):  # each rank got the SIGINT itself, and handled it
        assert run.rank_lines(rank)[-1] == f"rank {rank} interrupted", run.output
    detlaunch_runner.assert_no_leftovers()
    assert list(detlaunch_runner.tmpdir.iterdir()) == [], "mpirun left files in TMPDIR"


def test_mpirun_passes_launcher_arguments_and_refuses_several_nodes(detlaunch_runner: DetlaunchRunner) -> None:
    plan = detlaunch_runner.run("--layer", "mpirun", "--nproc-per-node", "3", "--dry-run", "--format", "json",
                                "--mca", "btl", "self,tcp", "--", RANKS, timeout=60)
    assert plan.returncode == 0, plan.output
    rendered = json.loads(plan.stdout)
    [mpirun] = rendered["commands"]
    rank_command = rendered["rank_wrapper"] + rendered["command"]
    head, tail = mpirun["argv"][: -len(rank_command)], mpirun["argv"][-len(rank_command):]
    assert tail == rank_command and "--rank-env" in rendered["rank_wrapper"]
    assert head[1:] == ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3",
                        "--mca", "btl", "self,tcp"], mpirun["argv"]
    assert (mpirun["stop_signal"], mpirun["env"]["TMPDIR"].endswith("/tmp")) == (int(signal.SIGTERM), True)
    two = detlaunch_runner.run("--layer", "mpirun", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--node-rank", "1",
                               "--dry-run", RANKS, timeout=60)
    assert (two.returncode, two.stderr) == (2, "detlaunch: error: the mpirun layer runs on one node, but this job "
                                               "has 2: use --layer horovod or --layer deepspeed for several nodes\n")
