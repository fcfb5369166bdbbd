"""A node's phase: where its part of the job is, and the one drawing of how it moves on."""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Where this node's part of the job is. Every change goes through NodeSupervisor.enter.

        STARTING ──(every peer's sshd answered: launchers start)──► RUNNING
            │                                                          │
            │  a failure, a signal, a timeout     the launchers ended, │ or a failure, a signal
            ▼                                     or every rank did    ▼
        STOPPING_RANKS ──(the ranks are gone: stop the launchers)──► STOPPING
          (the user's signal went to the ranks                         │  grace period over, or no
           first; launchers are left alone)                            │  rank runs any more after
                                                                       ▼  a failure: SIGKILL all
            STOPPING / KILLING ──(no child and no wrapper left)──► SWEEPING
                                                                       │  leftovers gone, or killed
                                                                       ▼  at the sweep deadline
        DONE ◄──(the link is closed)── CLOSING ◄──(every node said bye)── LOCAL_DONE
                                          │                                  │ chief: the restart
                        worker: "restart" │                                  │ policy says restart
                                          ▼                                  ▼
                                       BACKOFF ──(the delay is over: a new attempt)──► STARTING

    A signal in LOCAL_DONE or CLOSING (the chief waiting for other nodes) goes straight to DONE.
    A signal (or a lost chief) during BACKOFF ends the job: LOCAL_DONE, never a restart.
    After a lost node, BACKOFF lasts until every node is back too (the chief's go for the workers),
    whether it was lost while an attempt ran or during BACKOFF itself.

    Shown only by --debug's trace: `detlaunch status` shows the job's phase instead (observe/status.py's
    JobPhase: starting, running, stopping, finished), read from the events every node logs.
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING_RANKS = "stopping ranks"
    STOPPING = "stopping"
    KILLING = "killing"
    SWEEPING = "sweeping"
    LOCAL_DONE = "local done"
    CLOSING = "closing"
    DONE = "done"
    BACKOFF = "backoff"

    @property
    def active(self) -> bool:
        """The job is starting or running: new ranks are welcome, failures stop it."""
        return self in (Phase.STARTING, Phase.RUNNING)

    @property
    def stopping(self) -> bool:
        return self in (Phase.STOPPING_RANKS, Phase.STOPPING, Phase.KILLING)

    @property
    def over(self) -> bool:
        """Nothing of the job runs on this node any more."""
        return self in (Phase.LOCAL_DONE, Phase.CLOSING, Phase.DONE)
