"""Operating-system helpers every running part stands on.

Owns the one event loop (`eventloop.py`), processes (`procs.py`: spawning, reaping, killing
trees), the PID namespace a job runs in (`isolation.py`), private files and folders
(`safefs.py`), the job dir, its locks and the job secret (`jobdir.py`), run dirs that say
whether their owner lives (`rundirs.py`), the port check layers run (`ports.py`) and which processes
hold GPU memory, as nvidia-smi says (`gpu_memory.py`).

May import: `detlaunch.errors` and the standard library (psutil where the kernel lacks a file).
Knows nothing of jobs, plans or ranks.
"""
