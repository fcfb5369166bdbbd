"""Meta-tests: the docs cannot drift from the code.

- every hook in hookspecs.py has a section in docs/HOOKS.md whose flags (firstresult, historic) and
  parameters match the spec, and a row in its summary table; no section documents a hook that
  does not exist;
- every hook has at least one test in HOOK_TESTS below, each of which exists and exercises the
  hook (its source names it);
- the files docs/PLUGIN_GUIDE.md shows are, byte for byte, the tested example layer's files;
- the guide lists every check and every capability of the contract suite.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from detlaunch.planning import hookspecs
from detlaunch.testing import LayerContract
from detlaunch.testing.capabilities import CAPABILITY_NAMES
from support import paths

ROOT = paths.ROOT
HOOKS_MD = (ROOT / "docs" / "HOOKS.md").read_text()
GUIDE_MD = (ROOT / "docs" / "PLUGIN_GUIDE.md").read_text()
CONTRACT = "core/detlaunch/testing/contract.py::LayerContract::"

# Which tests exercise which hook. A contract test (detlaunch.testing) runs once per layer, through
# the LayerContract subclasses of tests/testing/test_contract.py.
HOOK_TESTS: dict[str, list[str]] = {
    "detlaunch_add_options": [
        "tests/planning/test_plugins.py::test_observers_see_the_job_and_cannot_change_its_exit_code",
    ],
    "detlaunch_discover_cluster": [
        "tests/planning/test_cluster.py::test_static_answers_only_when_asked",
    ],
    "detlaunch_rank_wrappers": [
        CONTRACT + "test_hooks_are_well_formed_and_deterministic",
    ],
    "detlaunch_environment": [
        CONTRACT + "test_hooks_are_well_formed_and_deterministic",
    ],
    "detlaunch_chief_stage": [
        CONTRACT + "test_entry_point_loads_through_the_real_loader",
        CONTRACT + "test_hooks_are_well_formed_and_deterministic",
    ],
    "detlaunch_worker_stage": [
        CONTRACT + "test_hooks_are_well_formed_and_deterministic",
    ],
    "detlaunch_doctor_checks": [
        "tests/planning/test_doctor.py::test_a_third_party_layer_gets_doctor_through_the_doctor_checks_hook",
    ],
    "detlaunch_preflight_checks": [
        "tests/planning/test_preflight.py::test_a_plugins_check_comes_through_the_detlaunch_preflight_checks_hook",
        CONTRACT + "test_preflight_checks_are_well_formed",
    ],
    "detlaunch_job_started": [
        "tests/planning/test_plugins.py::test_observers_see_the_job_and_cannot_change_its_exit_code",
        "tests/planning/discovery/test_discovery_determined.py::test_any_job_started_failure_is_one_line_naming_its_plugin",
    ],
    "detlaunch_event": [
        "tests/planning/test_plugins.py::test_observers_see_the_job_and_cannot_change_its_exit_code",
        "tests/layers/test_prometheus_example.py::test_the_metrics_follow_the_events",
    ],
    "detlaunch_job_finished": [
        "tests/planning/test_plugins.py::test_observers_see_the_job_and_cannot_change_its_exit_code",
    ],
    "detlaunch_spawners": [
        "tests/cli/test_spawn.py::test_a_plugins_spawner_comes_through_the_detlaunch_spawners_hook",
        "core/detlaunch/testing/spawner_contract.py::SpawnerContract::launches",
    ],
}


def spec_hooks() -> dict[str, dict[str, object]]:
    specs = {}
    for name, fn in vars(hookspecs).items():
        opts = getattr(fn, f"{hookspecs.PROJECT}_spec", None)
        if name.startswith("detlaunch_") and opts is not None:
            specs[name] = {**opts, "params": list(inspect.signature(fn).parameters)}
    return specs


SPECS = spec_hooks()


def section(hook: str) -> str:
    m = re.search(rf"^## `{hook}`\n(.*?)(?=^## |\Z)", HOOKS_MD, re.M | re.S)
    assert m, f"docs/HOOKS.md has no section `## \\`{hook}\\``"
    return m.group(1)


def yes_no(flag: object) -> str:
    return "yes" if flag else "no"


def test_the_spec_has_the_hooks_we_expect_to_document() -> None:
    assert len(SPECS) == 12 and "detlaunch_chief_stage" in SPECS  # the parsing above works


@pytest.mark.parametrize("hook", sorted(SPECS))
def test_every_hook_is_documented_as_the_spec_says(hook: str) -> None:
    text = section(hook)
    spec = SPECS[hook]
    assert f"- **firstresult**: {yes_no(spec['firstresult'])}\n" in text, f"{hook}: firstresult"
    assert f"- **historic**: {yes_no(spec['historic'])}\n" in text, f"{hook}: historic"
    params = ", ".join(f"`{p}`" for p in spec["params"])  # type: ignore[attr-defined]
    assert f"- **parameters**: {params}\n" in text, f"{hook}: parameters should read {params}"
    assert "- **returns**: " in text and "```python" in text, f"{hook}: return value and an example"
    row = f"| `{hook}` | {yes_no(spec['firstresult'])} | {yes_no(spec['historic'])} |"
    assert row in HOOKS_MD, f"the summary table's row for {hook} should start with {row}"


def test_no_section_documents_a_hook_that_does_not_exist() -> None:
    documented = set(re.findall(r"^## `(detlaunch_\w+)`", HOOKS_MD, re.M))
    assert documented == set(SPECS)


def test_every_hook_has_a_registered_test() -> None:
    assert set(HOOK_TESTS) == set(SPECS), "HOOK_TESTS must name tests for exactly the hooks in hookspecs.py"
    assert all(HOOK_TESTS.values())


def find_function(path: Path, qualname: str) -> str:
    """The source of `qualname` (a function, or Class::method) in `path`."""
    tree = ast.parse(path.read_text())
    parts = qualname.split("::")
    body: list[ast.stmt] = tree.body
    found: ast.stmt | None = None
    for i, part in enumerate(parts):
        wanted = ast.FunctionDef if i == len(parts) - 1 else ast.ClassDef
        found = next((n for n in body if isinstance(n, wanted) and n.name == part), None)
        assert isinstance(found, (ast.FunctionDef, ast.ClassDef)), f"{path}: no {'::'.join(parts[: i + 1])}"
        body = found.body
    assert found is not None
    source = ast.get_source_segment(path.read_text(), found)
    assert source is not None
    return source


@pytest.mark.parametrize(("hook", "ref"), [(h, r) for h, refs in sorted(HOOK_TESTS.items()) for r in refs])
def test_each_registered_test_exists_and_exercises_its_hook(hook: str, ref: str) -> None:
    path, _, qualname = ref.partition("::")
    source = find_function(ROOT / path, qualname)
    short = hook.removeprefix("detlaunch_")
    assert short in source, f"{ref} never mentions {short}: does it really exercise {hook}?"


def test_the_contract_tests_run_for_every_layer(real_processes: None) -> None:
    source = (ROOT / "tests" / "testing" / "test_contract.py").read_text()
    for layer in ("torchrun", "horovod", "deepspeed", "direct", "mpirun"):
        three_lines = rf"^class Test\w+\(LayerContract\):.*\n    layer = \"{layer}\"$"
        assert re.search(three_lines, source, re.M), f"tests/testing/test_contract.py does not run the suite: {layer}"


def test_the_guide_shows_the_tested_example_files_verbatim() -> None:
    blocks = re.findall(r"^<!-- file: (\S+) -->\n```\w*\n(.*?)^```$", GUIDE_MD, re.M | re.S)
    shown = {path for path, _ in blocks}
    assert shown == {"examples/detlaunch-mpirun/pyproject.toml", "examples/detlaunch-mpirun/detlaunch_mpirun/layer.py",
                     "examples/detlaunch-mpirun/tests/test_mpirun_contract.py",
                     "examples/detlaunch-jax/detlaunch_jax/layer.py"}
    for path, text in blocks:
        assert text == (ROOT / path).read_text(), f"docs/PLUGIN_GUIDE.md shows an outdated {path}"


def test_the_guide_lists_every_contract_check_and_capability() -> None:
    checks = [name for name in vars(LayerContract) if name.startswith("test_")]
    assert len(checks) >= 9
    for name in checks:
        assert f"`{name}" in GUIDE_MD, f"docs/PLUGIN_GUIDE.md does not describe the contract check {name}"
    for name in CAPABILITY_NAMES:
        assert f"| `{name}` |" in GUIDE_MD, f"docs/PLUGIN_GUIDE.md does not document the capability {name}"
