"""``detlaunch doctor``: what this node needs for a layer, checked, one line per check with its fix.

Core checks what every layer needs (the temp and job directories writable, the master and link
ports free, the ptrace policy); each layer adds its own through the ``detlaunch_doctor_checks`` hook (torch
importable, horovod's build, sshd/ssh/pdsh, deepspeed's accelerator), so a third-party layer gets
doctor for free. Checks only look: they start no job and write nothing but a probe file they remove.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.planning.config import NUMBERS, Config
from detlaunch.system.ports import check_port_free

PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


@dataclasses.dataclass(frozen=True)
class Check:
    """One thing this node needs, and what was found.

    required: a failed check that is not required (sshd on a one-node job) is a warning and does
    not change doctor's exit code.
    """

    name: str
    ok: bool
    detail: str = ""
    fix: str = ""
    required: bool = True

    @classmethod
    def on_path(cls, program: str, fix: str, env: Mapping[str, str], required: bool = True,
                also: Sequence[str] = ()) -> Check:
        """`program` on the PATH of `env` (or in one of the `also` directories, as detlaunch looks for it)."""
        path = os.pathsep.join([env.get("PATH", ""), *also])
        found = shutil.which(program, path=path)
        where = "PATH" if not also else f"PATH or {', '.join(also)}"
        return cls(f"{program} found", found is not None, found or f"not on {where}", fix, required)

    @classmethod
    def importable(cls, module: str, fix: str) -> Check:
        """`module` imports in this Python (it is imported: a broken install fails here, not in a rank)."""
        try:
            imported = importlib.import_module(module)
        except Exception as e:  # any error at all is what the ranks would get
            return cls(f"{module} importable", False, f"{type(e).__name__}: {e}".strip(), fix)
        return cls(f"{module} importable", True, str(getattr(imported, "__version__", "") or imported.__name__))

    @classmethod
    def torch_distributed(cls, fix: str = "pip install torch (CPU: pip install torch numpy)") -> list[Check]:
        """torch importable, and torch.distributed with gloo (what the ranks of a torch layer import)."""
        imported = cls.importable("torch", fix)
        if not imported.ok:
            return [imported]
        import torch.distributed as dist

        gloo = dist.is_available() and dist.is_gloo_available()
        return [imported, cls("torch.distributed with gloo", gloo, "available" if gloo else "missing",
                              "install a torch build with distributed support")]

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.required else "warn")
        text = f"{mark}  {self.name}: {self.detail}" if self.detail else f"{mark}  {self.name}"
        return f"{text} -- fix: {self.fix}" if not self.ok and self.fix else text


def writable_dir_check(name: str, path: str, fix: str) -> Check:
    """`path`, or the nearest folder above it that exists, is writable (detlaunch creates the rest)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return Check(name, False, f"{probe} is not a directory", fix)
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".detlaunch-doctor-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return Check(name, False, f"cannot write in {probe}: {e.strerror}", fix)
    return Check(name, True, path if probe == os.path.abspath(path) else f"{path} (can be created in {probe})")


def port_check(host: str, port: int, what: str = "master port", flag: str = "--master-port",
               required: bool = True) -> Check:
    """`port` can be listened on at `host`, as the job's listener will (`flag` is how to change it)."""
    name = f"{what} {port} free"
    try:
        check_port_free(host, port, flag)
    except ConfigError as e:
        return Check(name, False, str(e).split(":")[0], f"pick a free port with {flag}", required)
    return Check(name, True, f"on {host}")


def several_nodes(options: Mapping[str, object]) -> bool:
    """Whether the options describe a job on several nodes (only those use the link and ssh ports)."""
    return bool((options.get("nnodes") or 1) != 1 or options.get("hostfile")
                or "," in str(options.get("hosts") or ""))


def link_port_check(options: Mapping[str, object], master_port: int) -> Check:
    """The job link's port on the chief (plan.link_port): --link-port, else the master port + 1.
    Only a job on several nodes listens on it: on one node a failure is a warning."""
    multi = several_nodes(options)
    where = "" if multi else " (only for jobs on several nodes)"
    given = options.get("link_port")
    port = int(given) if isinstance(given, int) and given else master_port + 1
    if port > 65535:
        return Check("link port free", False, f"the master port {master_port} + 1 is no port",
                     "give --link-port PORT or a lower --master-port" + where, multi)
    check = port_check("127.0.0.1", port, "link port", "--link-port", multi)
    return dataclasses.replace(check, fix=check.fix + where) if not check.ok else check


def ptrace_check(scope_file: str = PTRACE_SCOPE, is_root: bool | None = None) -> Check:
    """Yama's ptrace policy: the supervisor (every rank's ancestor) reads stacks with py-spy."""
    name = "ptrace policy (stacks of hung ranks)"
    try:
        with open(scope_file) as f:
            scope = int(f.read().strip())
    except FileNotFoundError:
        return Check(name, True, "no Yama policy: a process may trace its user's processes")
    except (OSError, ValueError) as e:
        return Check(name, False, f"cannot read {scope_file}: {e}", f"check {scope_file}", required=False)
    root = os.geteuid() == 0 if is_root is None else is_root
    if scope == 0 or (scope <= 2 and root):
        return Check(name, True, f"ptrace_scope={scope}")
    fix = (f"echo 0 > {scope_file} (as root), or run as root" if scope <= 2
           else "none while the machine runs: scope 3 forbids ptrace to everyone until a reboot")
    return Check(name, False, f"ptrace_scope={scope}: py-spy may not read the ranks; their stacks come from "
                 "the faulthandler fallback (Python frames only, no C frames)", fix, required=False)


def isolation_check() -> Check:
    """Whether the job can run in a PID namespace of its own (isolation.py): nothing escapes it."""
    from detlaunch.system.isolation import probe

    name = "PID namespace for the job (nothing outlives a SIGKILLed detlaunch)"
    why = probe()
    if why is None:
        return Check(name, True, "available" + ("" if os.getuid() == 0 else " (in a user namespace)"))
    return Check(name, False, f"not available: {why}; the job runs without it, and a process that escapes its "
                 "rank (setsid) can outlive a SIGKILL of detlaunch", "allow user namespaces (sysctl "
                 "user.max_user_namespaces, kernel.unprivileged_userns_clone; Ubuntu 23.10 and later: "
                 "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for detlaunch) or run as root",
                 required=False)


def nvidia_uvm_check(dev: str = "/dev", is_root: bool | None = None) -> Check | None:
    """CUDA needs /dev/nvidia-uvm; on a freshly booted node the first CUDA program loads it through the
    setuid nvidia-modprobe, which cannot gain root inside the user namespace an ordinary user's job runs
    in. None on a node without NVIDIA GPUs."""
    if not glob.glob(os.path.join(dev, "nvidia[0-9]*")):
        return None
    name = "nvidia-uvm loaded (CUDA in the job's user namespace)"
    if os.path.exists(os.path.join(dev, "nvidia-uvm")):
        return Check(name, True, "loaded")
    if (os.geteuid() == 0) if is_root is None else is_root:
        return Check(name, True, "not loaded yet; as root the first CUDA program loads it")
    return Check(name, False, "not loaded, and the setuid nvidia-modprobe cannot load it inside the job's user "
                 "namespace: CUDA would fail with 'no CUDA-capable device'",
                 "load it once per boot: nvidia-modprobe -u -c=0 (or any CUDA program run outside detlaunch), "
                 "or run with --no-pid-namespace", required=False)


def core_checks(config: Config) -> list[Check]:
    """What every layer needs on this node."""
    o, env = config.options, config.env
    master_port = int(o.get("master_port") or NUMBERS["master_port"].default or 0)
    base = os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "detlaunch", "jobs")
    checks = [
        writable_dir_check("temp dir writable (private run dirs)", tempfile.gettempdir(),
                           "point TMPDIR at a writable directory"),
        writable_dir_check("job dir writable (per-job ssh keys)", o.get("job_dir") or base,
                           "give --job-dir DIR on a writable (shared, for several nodes) file system"),
        port_check("127.0.0.1", master_port),
        link_port_check(o, master_port),
        ptrace_check(),
        isolation_check(),
    ]
    uvm = nvidia_uvm_check()
    if uvm is not None:
        checks.append(uvm)
    if o.get("log_dir"):
        checks.append(writable_dir_check("--log-dir writable", o["log_dir"], "pick a writable --log-dir"))
    return checks


def exit_code(checks: Sequence[Check]) -> int:
    return exit_codes.FAILED if any(not c.ok and c.required for c in checks) else exit_codes.OK
