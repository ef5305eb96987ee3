"""One sandbox worker: started by `sandbox.pool` as root, runs exactly one untrusted program.

Standalone script (stdlib only, run as ``python -I -S worker.py UID CTL_FD [SITE_DIR...]``) so nothing of the
parent process (settings, secrets, open files) leaks into it. Three processes:

``outer``  (root, host namespaces) unshares net/mount/pid/ipc/uts namespaces, makes every
           mount read-only, puts private tmpfs over /tmp, /var/tmp and /dev/shm, forks ``init``,
           then reports ``init``'s rusage (the CPU time of everything the job ran) when it ends.
``init``   (root, pid 1 of the new pid namespace) mounts a fresh /proc, makes the job's 0700
           directory, says ``ready`` and blocks on stdin for its one job; forks ``job``, reaps
           everything until ``job`` exits, reports its status and exits -- the kernel then
           SIGKILLs whatever the job left behind (pid 1 of a namespace takes it all down).
``job``    drops to the slot's uid (no groups, no-new-privs, seccomp filter: no exec, no ptrace,
           no new namespaces, no mount), applies the rlimits and runs the code; the value of a
           trailing expression statement goes back as JSON (repr when not JSON-able).

Control messages are JSON lines on CTL_FD (``spawned``, ``ready``, ``result``, ``status``,
``exit``, ``setup_error``); stdout/stderr of the job go straight to the parent's pipes.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import json
import math
import os
import resource
import signal
import struct
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, NoReturn

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWCGROUP = 0x02000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP
)

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}

PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")
TMPFS_BYTES = 64 << 20
"""Size of the private /tmp (the job dir lives there): writes beyond it fail with ENOSPC."""
MAX_FILE_BYTES = 16 << 20
"""RLIMIT_FSIZE: largest file the job may write."""
MAX_OPEN_FILES = 256

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# Syscalls refused with EPERM (clone3 gets ENOSYS so libc falls back to clone, whose flags we can see).
_DENIED = (
    "execve execveat ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot unshare "
    "setns bpf perf_event_open keyctl add_key request_key userfaultfd kexec_load init_module "
    "finit_module delete_module io_uring_setup io_uring_enter io_uring_register"
).split()
_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310,
            "process_vm_writev": 311, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
            "unshare": 272, "setns": 308, "bpf": 321, "perf_event_open": 298, "keyctl": 250,
            "add_key": 248, "request_key": 249, "userfaultfd": 323, "kexec_load": 246,
            "init_module": 175, "finit_module": 313, "delete_module": 176, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "clone": 56, "clone3": 435,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
            "process_vm_writev": 271, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
            "unshare": 97, "setns": 268, "bpf": 280, "perf_event_open": 241, "keyctl": 219,
            "add_key": 217, "request_key": 218, "userfaultfd": 282, "kexec_load": 104,
            "init_module": 105, "finit_module": 273, "delete_module": 106, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "clone": 220, "clone3": 435,
        },
    ),
}  # fmt: skip

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class SetupError(RuntimeError):
    """The sandbox could not be built (missing privileges or kernel support)."""


def send(ctl: int, message: dict[str, Any]) -> None:
    """One JSON line on the control pipe; the leading newline ends any garbage the job wrote there."""
    data = b"\n" + json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(ctl, data) :]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _check(_libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data)), f"mount {target}")


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, parents first, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            target = fields[4].encode().decode("unicode_escape")  # \040 escapes for spaces
            keep = sum(flag for opt, flag in _KEEP_FLAGS.items() if opt in fields[5].split(","))
            points.append((target, keep))
    return points


def build_namespaces() -> None:
    """Fresh namespaces; the whole visible filesystem read-only except the private tmpfs mounts."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    for target, keep in _mount_points():
        try:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep)
        except SetupError:
            if target == "/":
                raise
            # Shadowed or special mounts (unreachable paths) may refuse; they stay as they are.
    for target in PRIVATE_TMPFS:
        if os.path.isdir(target):
            opts = f"size={TMPFS_BYTES},nr_inodes=4096,mode=0755"
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
    expose_python()


def _blocked_at(path: str) -> tuple[str, str] | None:
    """(first ancestor others may not traverse, the child of it on the way to ``path``)."""
    parts = os.path.realpath(path).strip("/").split("/")
    for i in range(len(parts) - 1):
        ancestor = "/" + "/".join(parts[:i])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor, parts[i]
    return None


def expose_python() -> None:
    """Let the unprivileged job import the standard library even when Python lives under a
    private directory (e.g. pyenv in /root, mode 0700): a read-only tmpfs replaces that
    directory, holding only bind mounts of the interpreter's own subdirectories -- so the rest
    of the private directory stays hidden."""
    wanted: dict[str, set[str]] = {}
    for path in {sys.base_prefix, sys.prefix, sys.exec_prefix, *sys.path}:
        if path and os.path.isdir(path) and (hit := _blocked_at(path)):
            wanted.setdefault(hit[0], set()).add(hit[1])
    for ancestor, children in wanted.items():
        fds = {child: os.open(os.path.join(ancestor, child), os.O_PATH) for child in children}
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=64,mode=0755")
        for child, fd in fds.items():
            os.mkdir(os.path.join(ancestor, child), 0o755)
            target = os.path.join(ancestor, child)
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
            os.close(fd)
        _mount(None, ancestor, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def seccomp_filter() -> None:
    """Install a BPF filter: the denied syscalls fail with EPERM, clone may not create namespaces."""
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        raise SetupError(f"no seccomp syscall table for {machine}")
    arch, nr = _SYSCALLS[machine]
    ld_w_abs, jeq_k, jge_k, jset_k, ret_k = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    allow_at = 12 + 2 * len(_DENIED)  # index of the final ALLOW
    prog: list[tuple[int, int, int, int]] = [
        (ld_w_abs, 0, 0, 4),  # 0: A = seccomp_data.arch
        (jeq_k, 1, 0, arch),  # 1
        (ret_k, 0, 0, eperm),  # 2: foreign ABI (e.g. int 0x80): refuse everything
        (ld_w_abs, 0, 0, 0),  # 3: A = seccomp_data.nr
        (jge_k, 0, 1, 0x40000000),  # 4: x32 ABI numbers
        (ret_k, 0, 0, eperm),  # 5
        (jeq_k, 0, 1, nr["clone3"]),  # 6
        (ret_k, 0, 0, enosys),  # 7: flags hidden behind a pointer; libc falls back to clone
        (jeq_k, 0, 3, nr["clone"]),  # 8
        (ld_w_abs, 0, 0, 16),  # 9: A = low word of args[0] = clone flags
        (jset_k, 0, allow_at - 11, NAMESPACE_FLAGS),  # 10
        (ret_k, 0, 0, eperm),  # 11
    ]
    for name in _DENIED:
        prog += [(jeq_k, 0, 1, nr[name]), (ret_k, 0, 0, eperm)]
    prog.append((ret_k, 0, 0, allow))
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def set_limit(which: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(which, (soft, soft if hard is None else hard))


def _encode_value(value: Any, cap: int) -> dict[str, Any]:
    try:
        text = json.dumps(value, allow_nan=False)
        encoded: Any = value
    except (TypeError, ValueError, RecursionError):
        text = encoded = repr(value)
    if len(text) > cap:
        return {"ok": False, "error_type": "output_limit", "error": f"return value over {cap} bytes"}
    return {"ok": True, "return_value": encoded, "has_value": True}


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]


def execute(code: str, cap: int) -> dict[str, Any]:
    """Run the program; the trailing expression statement's value is the return value."""
    namespace: dict[str, Any] | None = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = ast.parse(code, "<sandbox>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert last is None or isinstance(last, ast.Expr)
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if last is None:
            return {"ok": True, "return_value": None, "has_value": False}
        value = eval(compile(ast.Expression(last.value), "<sandbox>", "eval"), namespace)
        return _encode_value(value, cap)
    except SystemExit as exc:
        if exc.code in (None, 0):
            return {"ok": True, "return_value": None, "has_value": False}
        return {"ok": False, "error_type": "exception", "error": f"SystemExit: {exc.code}"}
    except MemoryError as exc:
        namespace = None  # free the job's memory so the report itself can be built
        return {"ok": False, "error_type": "memory", "error": _one_line(exc) if str(exc) else "MemoryError"}
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # hide this runner's frame
        traceback.print_exception(type(exc), exc, tb)
        return {"ok": False, "error_type": "exception", "error": _one_line(exc)}


def run_job(job: dict[str, Any], uid: int, job_dir: str, ctl: int) -> NoReturn:
    """The job process: drop privileges, limit, run, report. Never returns."""
    try:
        set_limit(resource.RLIMIT_NPROC, int(job["max_procs"]))
        set_limit(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
        set_limit(resource.RLIMIT_CORE, 0)
        set_limit(resource.RLIMIT_NOFILE, MAX_OPEN_FILES)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os.chdir(job_dir)
        os.environ.clear()
        os.environ.update(
            PATH="/usr/local/bin:/usr/bin:/bin",
            HOME=job_dir,
            TMPDIR=job_dir,
            LANG="C.UTF-8",
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONIOENCODING="utf-8",
        )
        seccomp_filter()
        cpu = max(1, math.ceil(float(job["timeout_s"])))
        set_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
        set_limit(resource.RLIMIT_AS, int(job["memory_mb"]) << 20)
    except BaseException as exc:
        send(ctl, {"kind": "setup_error", "error": f"job setup: {_one_line(exc)}"})
        os._exit(70)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
    result = execute(job["code"], int(job["max_output_bytes"]))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        send(ctl, {"kind": "result", **result})
    except Exception:
        os._exit(71)
    os._exit(0)


def init(uid: int, ctl: int) -> NoReturn:
    """Pid 1 of the sandbox: wait for the job, run it in a child, reap everything, report."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    job_dir = f"/tmp/job-{os.urandom(8).hex()}"
    os.mkdir(job_dir, 0o700)
    os.chown(job_dir, uid, uid)
    send(ctl, {"kind": "ready", "job_dir": job_dir})
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)  # the pool closed without a job
    job = json.loads(line)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    child = os.fork()
    if child == 0:
        run_job(job, uid, job_dir, ctl)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    send(ctl, {"kind": "status", "exit_code": code, "signal": sig})
    os._exit(0)


def main() -> None:
    uid, ctl = int(sys.argv[1]), int(sys.argv[2])
    sys.path.extend(sys.argv[3:])  # site-packages, without running site's .pth hooks (-S)
    try:
        if os.geteuid() != 0:
            raise SetupError("the sandbox worker must start as root")
        build_namespaces()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        child = os.fork()
    except (SetupError, OSError) as exc:
        send(ctl, {"kind": "setup_error", "error": str(exc)})
        os._exit(70)
    if child == 0:
        try:
            init(uid, ctl)
        except BaseException as exc:
            send(ctl, {"kind": "setup_error", "error": f"sandbox init: {_one_line(exc)}"})
            os._exit(70)
    os.close(0)
    send(ctl, {"kind": "spawned", "init_pid": child})
    _pid, _status, usage = os.wait4(child, 0)
    send(ctl, {"kind": "exit", "cpu_s": usage.ru_utime + usage.ru_stime})
    os._exit(0)


if __name__ == "__main__":
    main()
