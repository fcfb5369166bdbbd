"""The link between nodes: the chief's and the workers' supervisors, and questions from a shell.

Owns the job link over TCP: its messages (`messages.py`: every kind, who sends it, its fields), one
connection's wire (`wire.py`: JSON lines, bounded output, never blocking), who may join (`auth.py`:
the handshake and the chief's admission limits), the chief's side (`chief.py`) and a worker's
(`worker.py`), what the link needs to know of the job (`settings.py`); connecting with retries
and the sshd probes (`dial.py`), questions to a running job such as `detlaunch status`
(`control.py`) and the chief's open-files limit (`fdlimit.py`).

May import: `planning`, `restarts`, `observe`, `system`, `rank` and the top-level modules. Never
`node` or `cli`: the node's supervisor drives the link through small protocols.
"""
