"""torch's Flight Recorder in the hang report (rank/flightrec.py, stacks/flight.py, faultsite/sitecustomize.py).

The verdict first, in milliseconds, on dumps recorded from real gloo jobs of torch 2.13 (flight_dumps/:
each rank's answer as its thread sends it, taken while the job hung: `two`: rank 1 asleep while rank
0 waits in all_reduce #4; `chain`: 4 ranks, subgroups [0, 1] and [2, 3], rank 3 asleep before its
group's all_reduce, rank 2 waiting in it, ranks 0-1 in the world's; `done`: every collective
completed; `broadcast`: rank 1 asleep before broadcast #3). No GPU here: the NCCL-shaped dumps are
the recorded ones with NCCL's fields (`state` "completed", `pg_config` ranks) written in.

Then the rank's side with real processes: a Python started as the wrapper starts a rank answers
while its main thread is blocked, says nothing it does not know, and a rank that cannot answer
(its main thread holds the GIL, it is stopped, it exits) costs at most the deadline. A stand-in
`torch` package (tmp_path) plays torch.distributed there, so these take a fraction of a second; the
real thing, torchrun's gloo ranks, is in tests/node/test_flight_job.py.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from detlaunch.rank import faultdump, flightrec
from detlaunch.stacks.flight import summarize, verdict
from detlaunch.stacks.groups import format_json, format_text, group_stacks
from detlaunch.stacks.pyspy import Frame, ProcessStack, ThreadStack, to_json
from detlaunch.stacks.query import FlightQuestion, report_of

DUMPS = Path(__file__).parent / "flight_dumps"


def recorded(scenario: str, ranks: int) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r, 0): summarize((DUMPS / f"{scenario}-rank{r}.json").read_bytes()) for r in range(ranks)}


# -- the verdict, on recorded dumps -------------------------------------------------------------


def test_a_rank_asleep_before_the_collective_never_entered_it() -> None:
    flights = recorded("two", 2)
    assert flights[(0, 0)] == {"groups": [{"lib": "gloo", "pg": "0", "desc": "default_pg", "entered": 4,
                                           "op": "all_reduce", "completed": 3, "ranks": []}]}
    told = verdict(flights)
    assert told.lines == ("flight recorder: rank 1 never entered all_reduce #4 (rank 0 waits in it)",)
    assert told.suspects == {(1, 0): "never entered all_reduce #4 (flight recorder)"}


def test_the_suspect_is_the_rank_the_chain_of_waits_leads_to() -> None:
    told = verdict(recorded("chain", 4))
    assert told.lines == (
        "flight recorder: ranks 2-3 never entered all_reduce #3 (ranks 0-1 wait in it)",
        "flight recorder: rank 3 never entered all_reduce #2 of process group 2 (rank 2 waits in it)")
    # rank 2 never entered the world's #3 because it waits in its group's #2, which rank 3 never entered
    assert told.suspects == {(3, 0): "never entered all_reduce #2 of process group 2 (flight recorder)"}


def test_a_job_whose_collectives_all_completed_hangs_elsewhere() -> None:
    told = verdict(recorded("done", 2))
    assert told.lines == ("flight recorder: every rank completed every collective it entered (all_reduce #3): "
                          "the hang is not in a collective",)
    assert told.suspects == {}


def test_the_collectives_name_comes_from_the_ranks_that_entered_it() -> None:
    told = verdict(recorded("broadcast", 2))
    assert told.lines == ("flight recorder: rank 1 never entered broadcast #3 (rank 0 waits in it)",)


def test_a_rank_that_did_not_answer_is_said_and_no_rank_is_blamed_for_where_it_may_be() -> None:
    flights = recorded("chain", 3)
    flights[(3, 1)] = {"error": "did not answer within 2.0 s (its main thread may hold the GIL)"}
    told = verdict(flights)
    assert told.lines == (
        "flight recorder: rank 2 never entered all_reduce #3 (ranks 0-1 wait in it)",
        "flight recorder: rank 2 waits in all_reduce #2 of process group 2, which every rank of the group that "
        "answered entered",
        "flight recorder: rank 3: did not answer within 2.0 s (its main thread may hold the GIL)")
    assert told.suspects == {}  # rank 2 waits on someone: the chain leads to rank 3, which said nothing
    flights = recorded("two", 1) | {(1, 0): {"error": "it is stopped (SIGSTOP): it answers only once it continues"}}
    told = verdict(flights)  # rank 0 alone at its highest: nobody behind, it waits
    assert told.lines == ("flight recorder: rank 0 waits in all_reduce #4, which every rank of the group that "
                          "answered entered",
                          "flight recorder: rank 1: it is stopped (SIGSTOP): it answers only once it continues")
    assert told.suspects == {}
    told = verdict(recorded("done", 1) | {(1, 0): {"error": "it is stopped (SIGSTOP): it answers only once it "
                                                             "continues"}})
    assert told.lines[0] == "flight recorder: every rank that answered completed every collective it entered"


def test_a_job_without_torch_distributed_gets_no_flight_recorder_lines() -> None:
    assert verdict({(0, 0): {"error": flightrec.ABSENT}, (1, 0): {"error": flightrec.NO_FIFO}}).lines == ()
    told = verdict({(0, 0): {"error": "torch.distributed is not initialized (no process group yet)"},
                    (1, 0): {"error": "torch.distributed is not initialized (no process group yet)"}})
    assert told.lines == ("flight recorder: ranks 0-1: torch.distributed is not initialized (no process group yet)",)


def test_what_a_rank_sends_that_cannot_be_read_is_its_reason() -> None:
    whole = (DUMPS / "two-rank0.json").read_bytes()
    assert summarize(whole[:-40]) == {"error": "its answer could not be read (cut short?)"}
    assert summarize(b'{"error": "torch.distributed is not imported"}') == {
        "error": "torch.distributed is not imported"}
    assert summarize(b'{"fr": {"error": "RuntimeError"}}') == {"error": "torch's dump failed (fr: RuntimeError)"}
    assert summarize(b'{"fr": {"version": "2.10", "pg_status": {}}}') == {"groups": []}  # no collective yet
    assert verdict({(0, 0): {"groups": []}}).lines == ()


def nccl_like(scenario: str, rank: int, ranks: list[int], completed_up_to: int) -> bytes:
    """A recorded gloo dump as NCCL writes one: its own recorder's key, prefix, states and pg_config."""
    dump = json.loads((DUMPS / f"{scenario}-rank{rank}.json").read_bytes())["fr"]
    for e in dump["entries"]:
        e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
        e["retired"] = False
        e["state"] = "completed" if e["collective_seq_id"] <= completed_up_to else "started"
    dump["pg_status"] = {}
    dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(ranks)}}
    return json.dumps({"nccl": dump}).encode()


def test_nccl_dumps_are_read_by_their_state_and_a_mismatch_is_named() -> None:
    flights = {(0, 0): summarize(nccl_like("two", 0, [0, 1], 3)), (1, 0): summarize(nccl_like("two", 1, [0, 1], 3))}
    assert flights[(0, 0)]["groups"][0]["lib"] == "nccl"
    assert verdict(flights).lines == ("flight recorder: rank 1 never entered all_reduce #4 (rank 0 waits in it)",)
    raw = json.loads(nccl_like("two", 1, [0, 1], 3))
    last = copy.deepcopy(raw["nccl"]["entries"][-1])
    last.update(collective_seq_id=4, profiling_name="nccl:broadcast", state="started")
    raw["nccl"]["entries"].append(last)  # rank 1's #4 is a broadcast, rank 0's an all_reduce: a mismatch
    flights[(1, 0)] = summarize(json.dumps(raw).encode())
    told = verdict(flights)
    assert told.lines == ("flight recorder: the ranks entered different collectives as #4: rank 0 all_reduce; "
                          "rank 1 broadcast",)
    assert told.suspects == {}


def test_gloo_and_nccl_recorders_of_one_rank_are_told_apart() -> None:
    both = {r: json.loads(nccl_like("two", r, [0, 1], 3)) | json.loads((DUMPS / f"done-rank{r}.json").read_bytes())
            for r in (0, 1)}  # "cpu:gloo,cuda:nccl": each backend numbers its own collectives
    flights = {(r, 0): summarize(json.dumps(both[r]).encode()) for r in (0, 1)}
    assert [g["lib"] for g in flights[(0, 0)]["groups"]] == ["gloo", "nccl"]
    assert verdict(flights).lines == ("flight recorder: rank 1 never entered nccl all_reduce #4 (rank 0 waits in it)",)


# -- the verdict in the stacks' report: it wins over the stack rule ------------------------------


SITE = "/venv/lib/python3.11/site-packages"


def stack(*frames: Frame, stopped: bool = False) -> ProcessStack:
    return ProcessStack(1, (ThreadStack("MainThread", 1, False, frames),), stopped)


def test_the_flight_recorders_suspect_wins_over_the_stack_rule() -> None:
    """The GPU picture: rank 0's collective returned at once, it blocks at its next sync point; rank 1 is in
    a collective of another library's. The stack rule names rank 0; the Flight Recorder rank 1."""
    at_sync = stack(Frame("item", "/job/train.py", 90, "loss.item()"), Frame("<module>", "/job/train.py", 120))
    in_c10d = stack(Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 10, "work.wait()"),
                    Frame("<module>", "/job/train.py", 60))
    results = {(0, 0): at_sync, (1, 0): in_c10d}
    assert [s.rank for s in group_stacks(results).suspects] == [0]  # the stack rule alone: the wrong rank
    report = group_stacks(results, named={(1, 0): "never entered all_reduce #4 (flight recorder)"})
    assert [(s.rank, s.why) for s in report.suspects] == [(1, "never entered all_reduce #4 (flight recorder)")]
    assert format_text(report) == [
        "rank 0 (node 0): loss.item <- item (train.py:90)",
        "rank 1 (node 0): work.wait <- barrier <- <module> (train.py:60)  [suspect: never entered all_reduce #4 "
        "(flight recorder)]"]
    stopped = group_stacks({**results, (2, 1): stack(Frame("f", "/job/t.py", 1), stopped=True)},
                           named={(1, 0): "never entered all_reduce #4 (flight recorder)"})
    assert [(s.rank, s.why) for s in stopped.suspects] == [(1, "never entered all_reduce #4 (flight recorder)"),
                                                            (2, "SIGSTOPped")]  # a fact, not a guess: it stays


def test_the_jobs_answer_carries_the_verdict_before_the_stacks() -> None:
    sleeping = stack(Frame("<module>", "/job/hang.py", 75, "time.sleep(300)"))
    waiting = stack(Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 10, "work.wait()"),
                    Frame("<module>", "/job/hang.py", 80))
    flights = recorded("two", 2)
    answer = {"job": "j", "nodes": [{"node": 0, "ranks": [
        {"rank": 0, "pid": 10, "stack": to_json(waiting), "flight": flights[(0, 0)]},
        {"rank": 1, "pid": 11, "stack": to_json(sleeping), "flight": flights[(1, 0)]}]}], "missing": []}
    report = report_of(answer)
    assert format_text(report)[0] == "flight recorder: rank 1 never entered all_reduce #4 (rank 0 waits in it)"
    assert [(s.rank, s.why) for s in report.suspects] == [(1, "never entered all_reduce #4 (flight recorder)")]
    assert format_json(report)["flight_recorder"] == [format_text(report)[0]]
    for r in answer["nodes"][0]["ranks"]:  # type: ignore[index]
        del r["flight"]  # a dump before kill does not ask: the report is the stacks' alone
    assert report_of(answer).flight == () and report_of(answer).suspects[0].why == (
        "not in the collective the others wait in")


# -- the wrapper's side ------------------------------------------------------------------------------


def test_the_wrapper_turns_the_recorder_on_unless_the_user_chose_and_makes_a_private_fifo(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    path = flightrec.prepare(str(tmp_path), 3, env)
    assert path == str(tmp_path / "flight-3") and env == {"TORCH_FR_BUFFER_SIZE": "2000", flightrec.ENV: path}
    mode = os.stat(path).st_mode
    assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600
    assert flightrec.prepare(str(tmp_path), 3, env) == path  # an earlier attempt's is replaced
    for chosen in ({"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}):
        mine = dict(chosen)
        flightrec.prepare(str(tmp_path), 4, mine)
        assert {k: v for k, v in mine.items() if k != flightrec.ENV} == chosen
    off = {flightrec.SWITCH: "0"}
    assert flightrec.prepare(str(tmp_path), 5, off) is None and off == {flightrec.SWITCH: "0"}
    no_site: dict[str, str] = {}
    assert flightrec.prepare(str(tmp_path), 6, no_site, listener=False) is None
    assert no_site == {"TORCH_FR_BUFFER_SIZE": "2000"} and not (tmp_path / "flight-6").exists()


def test_the_sitecustomize_reads_the_variable_the_wrapper_sets() -> None:
    site = (Path(faultdump.SITE_DIR) / "sitecustomize.py").read_text()
    assert f'os.environ.pop("{flightrec.ENV}", None)' in site
    assert all(f'(b"{key}", "_dump_' in site for key in ("fr", "nccl"))  # the keys summarize reads


# -- the rank's side, real processes -------------------------------------------------------------------

TORCH_STUB = {  # torch.distributed as far as the listener looks: sys.modules, is_available, is_initialized
    "torch/__init__.py": "",
    "torch/_C/__init__.py": "",
    "torch/_C/_distributed_c10d.py": """
import os
def _dump_fr_trace_json(includeCollectives=True, onlyActive=False):
    if os.environ.get("DUMP") == "exit":
        os._exit(3)
    with open(os.environ["DUMP"], "rb") as f:
        return __import__("json").dumps(__import__("json").loads(f.read())["fr"]).encode()
""",
    "torch/distributed/__init__.py": """
import os
from torch._C import _distributed_c10d  # noqa: F401
def is_available():
    return True
def is_initialized():
    return os.environ.get("INITIALIZED", "1") == "1"
""",
}
BLOCKED = """
import sys
{imports}
print("up", flush=True)
{block}
"""
READ_STDIN = "sys.stdin.buffer.read(1)  # blocked in C: read(2), the GIL released"


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    stub = tmp_path / "stub"
    for name, text in TORCH_STUB.items():
        (stub / name).parent.mkdir(parents=True, exist_ok=True)
        (stub / name).write_text(text)
    procs: list[subprocess.Popen[str]] = []

    def start(block: str = READ_STDIN, imports: str = "import torch.distributed",
              **extra: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", flightrec.SWITCH, faultdump.SWITCH)}
        env.update({"PYTHONPATH": str(stub), "DUMP": str(DUMPS / "two-rank0.json"), **extra})
        faultdump.prepare(str(tmp_path), len(procs), env)
        flightrec.prepare(str(tmp_path), len(procs), env)
        p = subprocess.Popen([sys.executable, "-c", BLOCKED.format(imports=imports, block=block)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline() == "up\n", p.communicate(timeout=10)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()  # by its PID: our child
        p.communicate()


def ask(tmp_path: Path, index: int, pid: int, budget: float = 2.0) -> tuple[dict[str, Any], float]:
    question = FlightQuestion({pid: flightrec.fifo_path(str(tmp_path), index)})
    start = time.monotonic()
    question.send(start + budget)
    question.receive(start + budget)
    return question.summaries[pid], time.monotonic() - start


@pytest.mark.timeout(30)
def test_a_rank_blocked_in_c_answers_from_its_thread_again_and_again(
        real_processes: None, tmp_path: Path, rank: Callable[..., subprocess.Popen[str]]) -> None:
    p = rank()
    for _ in range(3):
        summary, took = ask(tmp_path, 0, p.pid)
        assert summary == summarize((DUMPS / "two-rank0.json").read_bytes()) and took < 1.5
    assert sorted(os.listdir(tmp_path)) == ["flight-0", "stack-0", "stub"]  # each reply FIFO is gone again
    assert p.stdin is not None
    p.stdin.write("x")
    p.stdin.flush()
    assert p.wait(10) == 0  # undisturbed: the read(2) went on and the script ended


@pytest.mark.timeout(30)
def test_a_rank_that_cannot_answer_costs_the_deadline_at_most_and_says_why(
        real_processes: None, tmp_path: Path, rank: Callable[..., subprocess.Popen[str]]) -> None:
    holding = rank(block="sum(range(10**12))  # one C call that never lets the GIL go")
    for _ in range(3):  # its thread may take the GIL before the main thread is back from printing "up"
        summary, took = ask(tmp_path, 0, holding.pid, budget=1.0)
        if "error" in summary:
            break
    assert summary == {"error": "did not answer within 1.0 s (its main thread may hold the GIL in a C call that "
                                "does not release it)"} and 0.9 < took < 2.0
    stopped = rank()
    os.kill(stopped.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{stopped.pid}/stat").read_text().split(") ")[1][0] != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    summary, took = ask(tmp_path, 1, stopped.pid)
    assert summary == {"error": "it is stopped (SIGSTOP): it answers only once it continues"} and took < 0.5
    exiting = rank(DUMP="exit")  # it dies as it is asked: its pidfd ends the wait
    summary, took = ask(tmp_path, 2, exiting.pid, budget=5.0)
    assert summary == {"error": "it exited before it answered"} and took < 2.0 and exiting.wait(5) == 3


@pytest.mark.timeout(30)
def test_a_rank_says_only_what_it_knows(real_processes: None, tmp_path: Path,
                                        rank: Callable[..., subprocess.Popen[str]]) -> None:
    not_yet = rank(INITIALIZED="0")
    assert ask(tmp_path, 0, not_yet.pid)[0] == {"error": "torch.distributed is not initialized (no process group yet)"}
    plain = rank(imports="import torch")
    summary, took = ask(tmp_path, 1, plain.pid)  # never imported torch.distributed: no thread in it at all
    assert summary == {"error": flightrec.ABSENT} and took < 0.5
    with open(f"/proc/{plain.pid}/status") as f:
        assert "Threads:\t1\n" in f.read()
    listening = rank()
    with open(f"/proc/{listening.pid}/status") as f:
        assert "Threads:\t2\n" in f.read()  # the one thread, started at the import of torch.distributed
