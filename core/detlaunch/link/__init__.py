"""The link between nodes: the chief's and the workers' supervisors, and questions from a shell.

Owns the job link over TCP (`joblink.py`: admission, authentication, the chief's and a worker's
side), connecting with retries and the sshd probes (`dial.py`), questions to a running job such as
`detlaunch status` (`control.py`) and the chief's open-files limit (`fdlimit.py`).

May import: `planning`, `restarts`, `observe`, `system`, `rank` and the top-level modules. Never
`node` or `cli`: the node's supervisor drives the link through small protocols.
"""
