"""A rank that crashes in Python's teardown after its work is done does not fail the job, on every layer, warm or
cold: each rank does a real collective, then rank 1 aborts once its Python has finalized (a C exit handler: what
torch's gloo threads do about 1 run in 6). The job exits 0 and says so; --strict-teardown fails it with 134."""

from __future__ import annotations

import pytest
from support.helpers import free_port, rank_lines, report_line
from support.jobs import SCRIPTS, Launcher

pytestmark = pytest.mark.timeout(300)

SCRIPT = str(SCRIPTS / "teardown_abort.py")
SAID = ("[rank=1] detlaunch: rank 1 killed by SIGABRT while Python finalized, after its script and its atexit "
        "handlers had finished: counted as finished, exit 0 (--strict-teardown counts it as failed)")
REPORTED = ("detlaunch:   rank 1 (node 0): exit 0 (killed by SIGABRT while Python finalized, after its script and "
            "its atexit handlers had finished: counted as finished)")


@pytest.mark.parametrize("how", [("direct",), ("direct", "--no-warm-ranks"), ("torchrun",), ("deepspeed",),
                                 ("horovod",)], ids=lambda how: "-".join(how).replace("--no-warm-ranks", "cold"))
def test_a_crash_in_teardown_after_the_work_is_done_does_not_fail_the_job(launcher: Launcher,
                                                                          how: tuple[str, ...]) -> None:
    layer, *extra = how
    r = launcher.run("--layer", layer, "--nproc-per-node", "2", "--master-port", str(free_port()), *extra, SCRIPT,
                     timeout=240)
    assert r.returncode == 0, r.output
    for rank in (0, 1):
        assert rank_lines(r.stdout, rank) == [f"rank {rank} of 2: sum 2"], r.output
    assert SAID in r.stderr.splitlines() and REPORTED in r.stderr.splitlines(), r.stderr
    assert "detlaunch: job finished: 2 rank(s) exited 0 in " in r.stderr
    launcher.assert_no_leftovers()


def test_strict_teardown_fails_the_job_with_the_ranks_own_signal(launcher: Launcher) -> None:
    r = launcher.run("--layer", "direct", "--nproc-per-node", "2", "--master-port", str(free_port()),
                     "--strict-teardown", SCRIPT)
    assert r.returncode == 134, r.output
    assert report_line(r.stderr) == ("detlaunch: job failed: rank 1 on node 0 (127.0.0.1) killed by SIGABRT after "
                                     "its script and its atexit handlers had finished (its work was done: Python was "
                                     "finalizing)")
    assert "counted as finished" not in r.stderr
    launcher.assert_no_leftovers()
