"""The sandbox's fork server: started once per pool by ``sandbox.pool`` as root; every session is
a fork of a process that has already imported the runtime, so nothing pays for an interpreter start.

Standalone script (stdlib only, run as ``python -I -S forkserver.py CTL_FD PRELOAD_JSON
[SITE_DIR...]``) so nothing of the parent process (settings, secrets, open files) leaks into it.
``PRELOAD_JSON`` (``{"paths", "modules", "env"}``, see ``sandbox.pool.Preload``) names what a
pool's every session would otherwise import itself (tau2's domains: seconds each). Processes:

``outer``   (root, host namespaces) imports the runtime, unshares net/mount/pid/ipc/uts
            namespaces, makes every mount read-only with private tmpfs over /tmp, /var/tmp and
            /dev/shm, imports the preload (inside them: no network, nothing writable), forks
            ``server`` and exits when it does.
``server``  (root, pid 1 of the sandbox's pid namespace) takes requests on CTL_FD (a
            SOCK_SEQPACKET socket): ``slot`` (with the slot's two pipes as SCM_RIGHTS) makes a
            slot for a uid; ``open`` and ``kill`` go to the slot of the session; each slot's
            ``ended`` comes back. Closing CTL_FD ends everything.
``slot``    (root, pid 1 of its own pid, mount and ipc namespaces: its own /proc, a private /tmp
            with the 0700 job dir; the seccomp filter -- no exec, no ptrace, no new namespaces,
            no mount -- installed once here) runs its uid's sessions one at a time. While idle it
            keeps a spare holder forked. When a session's holder ends, the slot kills whatever
            the session left (kill(-1) spares only pid 1), empties the job dir and reports
            ``ended`` with how the holder ended.
``holder``  (the slot's unprivileged uid: no groups, no-new-privs, the filter, rlimits; the spare
            drops to the uid only once its session arrives, so no process of the uid outlives a
            session) keeps the session's Python namespaces and answers requests in-process. A
            request that fails (an exception, MemoryError, the output cap) or is sent with
            ``commit=False`` is rolled back: the globals as they were, plain-data values restored
            from a pickle taken before (see ``Space``). A call that crashes or runs over its time
            ends the session (the pool kills it); its slot reports how.

A slot's two pipes serve all its sessions (passing a unix socket per session costs more than
the rest of opening one): the holder writes a ``ready`` frame first, and the pool writes nothing
before it; the slot drains the request pipe before each session and the pool the answer pipe
after one. Frames are a 4-byte big-endian length and a JSON object. Requests:
``{"op": "run", "source", "bind", "space", "commit", "timeout_s", "max_output_bytes"}`` runs
statements (the trailing expression's value is the return value) in the namespace ``space`` after
binding ``bind``'s values as globals; ``{"op": "call", "tool", "arguments", ...}`` calls
``tool(**arguments)`` found in ``space``; ``{"op": "read", "name", "space"}`` returns a global's
value; ``{"op": "close"}`` ends the session. Every answer is ``{"ok", "return_value",
"error_type", "error", "stdout", "stderr", "truncated", "cpu_s"}``.
"""

from __future__ import annotations

import ast
import builtins
import copy
import ctypes
import json
import math
import os
import pickle
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, NoReturn

PRELOAD = "collections datetime functools heapq itertools operator random re string".split()
"""What generated environment code commonly imports: loaded once by the server, not per session."""

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
JOB_DIR = "/tmp/job"
"""Every session's home and only writable place: on the slot's private /tmp, emptied between sessions."""

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


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


Filter = tuple["ctypes.Array[ctypes.c_char]", _SockFprog]
"""A built seccomp program: its buffer (kept alive) and the sock_fprog pointing at it."""


def build_filter() -> Filter:
    """The BPF program: the denied syscalls fail with EPERM, clone may not create namespaces.

    Built once by the server (ctypes class and buffer set-up costs more than a fork); every
    session installs the same one."""
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
    return buf, _SockFprog(len(prog), ctypes.addressof(buf))


def seccomp_filter(program: Filter) -> None:
    """Install ``program`` (from ``build_filter``) for this process and everything it starts."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program[1]), 0, 0), "seccomp")


def set_limit(which: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(which, (soft, soft if hard is None else hard))


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# --------------------------------------------------------------------------- frames


def write_frame(fd: int, body: bytes) -> None:
    """One frame: a 4-byte big-endian length, then ``body`` (a JSON object)."""
    data = struct.pack(">I", len(body)) + body
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int) -> dict[str, Any] | None:
    """The next request, or None when the pool closed the session."""
    head = _read_exact(fd, 4)
    body = _read_exact(fd, struct.unpack(">I", head)[0]) if head else None
    return json.loads(body) if body is not None else None


def answer_bytes(answer: dict[str, Any], value_json: str | None = None) -> bytes:
    """An answer's frame body; ``value_json`` is the return value already encoded (spliced, not re-encoded)."""
    text = json.dumps(answer)
    if value_json is not None:
        text = text[:-1] + ', "return_value": ' + value_json + "}"
    return text.encode()


# --------------------------------------------------------------------------- running code


def _encode_value(value: Any, cap: int) -> tuple[dict[str, Any], str | None]:
    """(answer fields, the value as JSON text) -- JSON when it is JSON-able, else its repr."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(repr(value))
    if len(text) > cap:
        return {"ok": False, "error_type": "output_limit", "error": f"return value over {cap} bytes"}, None
    return {"ok": True}, text


def _failure(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, SystemExit):
        if exc.code in (None, 0):
            return {"ok": True}
        return {"ok": False, "error_type": "exception", "error": f"SystemExit: {exc.code}"}
    if isinstance(exc, MemoryError):
        return {"ok": False, "error_type": "memory", "error": _one_line(exc) if str(exc) else "MemoryError"}
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # hide this runner's frame
    traceback.print_exception(type(exc), exc, tb)
    return {"ok": False, "error_type": "exception", "error": _one_line(exc)}


def run_source(source: str, namespace: dict[str, Any], cap: int) -> tuple[dict[str, Any], str | None]:
    """Run statements in ``namespace``; the trailing expression statement's value is the return value."""
    try:
        tree = ast.parse(source, "<sandbox>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert last is None or isinstance(last, ast.Expr)
        exec(compile(tree, "<sandbox>", "exec"), namespace)
        if last is None:
            return {"ok": True}, None
        value = eval(compile(ast.Expression(last.value), "<sandbox>", "eval"), namespace)
    except BaseException as exc:
        return _failure(exc), None
    return _encode_value(value, cap)


def call_tool(
    name: str, arguments: dict[str, Any], namespace: dict[str, Any], cap: int
) -> tuple[dict[str, Any], str | None]:
    """``name(**arguments)``, ``name`` a callable global of ``namespace``."""
    tool = namespace.get(name) if name.isidentifier() and not name.startswith("__") else None
    if not callable(tool):
        return {"ok": False, "error_type": "exception", "error": f"NameError: no tool {name!r}"}, None
    try:
        value = tool(**arguments)
    except BaseException as exc:
        return _failure(exc), None
    return _encode_value(value, cap)


def _captured(fd: int, cap: int) -> tuple[str, bool]:
    """What the call wrote on ``fd`` (a memfd), at most ``cap`` bytes, and whether there was more."""
    data = os.pread(fd, cap + 1, 0)
    return data[:cap].decode(errors="replace"), len(data) > cap


def fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


DATA_TYPES = (dict, list, set, tuple, str, int, float, bool, type(None))
"""Globals of these types are a space's state: deep-copied before a call, restored if it fails."""


class Space:
    """One namespace of the session: the globals its code and ``bind`` defined."""

    def __init__(self) -> None:
        self.globals = fresh_namespace()

    def checkpoint(self) -> tuple[dict[str, Any], Any]:
        """What ``rollback`` needs: the globals (shallow) and the state's values (deep)."""
        values = {
            n: v for n, v in self.globals.items() if isinstance(v, DATA_TYPES) and not n.startswith("__")
        }
        try:
            deep: Any = pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            try:
                deep = ("copy", copy.deepcopy(values))
            except Exception:
                deep = None  # a state nothing can copy: a failed call's changes to it stay
        return dict(self.globals), deep

    def rollback(self, point: tuple[dict[str, Any], Any]) -> None:
        """Back to ``point``: names added since are gone, rebound ones and the state's values restored."""
        shallow, deep = point
        self.globals.clear()
        self.globals.update(shallow)
        if isinstance(deep, bytes):
            self.globals.update(pickle.loads(deep))
        elif isinstance(deep, tuple):
            self.globals.update(deep[1])


def _cpu_for_call(usage: Any, timeout: float) -> None:
    """Move the soft CPU limit to what this process used so far plus one call's share: SIGXCPU
    stops a call that spins (its children start from zero with the same share)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    want = math.ceil(usage.ru_utime + usage.ru_stime) + max(1, math.ceil(timeout))
    resource.setrlimit(
        resource.RLIMIT_CPU, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard)
    )


def perform(request: dict[str, Any], spaces: dict[str, Space], streams: tuple[Any, Any]) -> bytes:
    """Run one request in this process; a request that fails (or asked not to commit) is rolled back."""
    for fd in (1, 2):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    cap = int(request["max_output_bytes"])
    op = request["op"]
    space = spaces.setdefault(str(request.get("space") or "main"), Space())
    value_cap = int(request.get("max_value_bytes") or cap)
    point = space.checkpoint() if op != "read" else None
    before = resource.getrusage(resource.RUSAGE_SELF)
    _cpu_for_call(before, float(request["timeout_s"]))
    bind: dict[str, Any] = request.get("bind") or {} if op == "run" else {}
    if op == "run":
        space.globals.update(bind)
        answer, value = run_source(str(request["source"]), space.globals, value_cap)
    elif op == "call":
        answer, value = call_tool(str(request["tool"]), dict(request["arguments"]), space.globals, value_cap)
    elif op == "read" and str(request["name"]) in space.globals:
        answer, value = _encode_value(space.globals[str(request["name"])], value_cap)
    elif op == "read":
        answer, value = (
            {"ok": False, "error_type": "exception", "error": f"NameError: {request['name']!r}"},
            None,
        )
    else:
        answer, value = {"ok": False, "error_type": "sandbox_error", "error": f"unknown op {op!r}"}, None
    if point is not None and not (answer["ok"] and request.get("commit", True)):
        space.rollback(point)  # before the report: a memory bomb's memory is freed here
    for stream in (sys.stdout, sys.stderr, *streams):
        try:
            stream.flush()
        except Exception:
            pass
    sys.stdout, sys.stderr = streams  # a call may have replaced them
    stdout, out_cut = _captured(1, cap)
    stderr, err_cut = _captured(2, cap)
    if out_cut or err_cut:
        if point is not None and answer["ok"] and request.get("commit", True):
            space.rollback(point)
        answer, value = (
            {"ok": False, "error_type": "output_limit", "error": f"output over the {cap}-byte limit"},
            None,
        )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    answer.update(stdout=stdout, stderr=stderr, truncated=out_cut or err_cut, cpu_s=round(cpu, 6))
    return answer_bytes(answer, value)


# --------------------------------------------------------------------------- sessions


def _reap_nowait() -> list[tuple[int, int, Any]]:
    """Reap every child that has ended: (pid, status, rusage) each."""
    ended: list[tuple[int, int, Any]] = []
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status, usage))


def kill_others() -> None:
    """SIGKILL every other process this uid runs in the slot: what a call left running."""
    try:
        os.kill(-1, signal.SIGKILL)  # pid 1 (the slot, root) and this process are spared
    except ProcessLookupError:
        return
    _reap_nowait()


def _close_all_but(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


Channel = tuple[int, int]
"""A session's two pipes: the one it reads requests from, the one it writes answers to (pipes, not a
socket pair: passing a unix socket along makes every hop wait for the kernel's in-flight fd collector)."""


SESSION_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": JOB_DIR,
    "TMPDIR": JOB_DIR,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}
"""A session's whole environment (set by its slot, so a holder inherits it)."""


def prepare_session(keep: tuple[int, ...]) -> tuple[Any, Any]:
    """A holder's set-up that needs no session settings (``keep``: the inherited fds it needs):
    output memfds as stdout/stderr. The slot already filtered syscalls and set the environment."""
    _close_all_but(*keep)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    for target, name in ((1, "stdout"), (2, "stderr")):
        fd = os.memfd_create(name, 0)
        os.dup2(fd, target)
        os.close(fd)
    out = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    err = open(2, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout, sys.stderr = out, err
    return out, err


def enter_session(settings: dict[str, Any]) -> None:
    """The session's limits, then its uid (for good: no way back to root) and its job dir."""
    uid = int(settings["uid"])
    set_limit(resource.RLIMIT_NPROC, int(settings["max_procs"]))
    set_limit(resource.RLIMIT_FSIZE, MAX_FILE_BYTES)
    set_limit(resource.RLIMIT_CORE, 0)
    set_limit(resource.RLIMIT_NOFILE, MAX_OPEN_FILES)
    # Hard: the whole session's CPU time; the soft limit is moved before each call (``perform``).
    per_call = max(1, math.ceil(float(settings["timeout_s"])))
    set_limit(resource.RLIMIT_CPU, per_call, max(per_call + 1, math.ceil(float(settings["cpu_s"]))))
    set_limit(resource.RLIMIT_AS, int(settings["memory_mb"]) << 20)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.chdir(JOB_DIR)


def holder(settings: dict[str, Any], channel: Channel) -> NoReturn:
    """A session's one process: serve requests until the pool closes the session."""
    try:
        streams = prepare_session(channel)
        enter_session(settings)
        write_frame(channel[1], READY)
    except BaseException as exc:
        with _suppress():
            body = {"ok": False, "error_type": "sandbox_error", "error": f"session setup: {_one_line(exc)}"}
            write_frame(channel[1], answer_bytes(body))
        os._exit(70)
    serve(channel, streams)


READY = b'{"ready": true}'
"""A holder's first frame: it has taken the slot's pipes over (the pool writes nothing before it)."""


def serve(channel: Channel, streams: tuple[Any, Any]) -> NoReturn:
    """Answer the session's requests until the pool closes its socket."""
    spaces: dict[str, Space] = {}
    while True:
        request = read_frame(channel[0])
        if request is None or request.get("op") == "close":
            os._exit(0)
        write_frame(channel[1], perform(request, spaces, streams))
        kill_others()


def spare_holder(chan: socket.socket, channel: Channel) -> NoReturn:
    """A holder made before its session, while the slot is idle: it prepares (still root, so no
    process of the slot's uid outlives a session), waits on ``chan`` for its session's socket and
    settings, enters the session and serves it."""
    try:
        streams = prepare_session((chan.fileno(), *channel))
        data = chan.recv(1 << 16)
        if not data:
            os._exit(0)  # the slot is gone, or gave up on this spare
        chan.close()
        enter_session(json.loads(data))
        write_frame(channel[1], READY)
    except BaseException as exc:
        with _suppress():
            body = {"ok": False, "error_type": "sandbox_error", "error": f"session setup: {_one_line(exc)}"}
            write_frame(channel[1], answer_bytes(body))
        os._exit(70)
    serve(channel, streams)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


# --------------------------------------------------------------------------- slots


REAP_EVERY_S = 0.05
"""How often a slot reaps what a running session's processes left (zombies count against max_procs)."""


def _fresh_job_dir(uid: int) -> None:
    """An empty job dir for the next session (the last one's files gone with it)."""
    try:
        if not os.listdir(JOB_DIR):  # the common case: nothing written, only its mode to reset
            os.chmod(JOB_DIR, 0o700)
            return
    except OSError:
        pass
    shutil.rmtree(JOB_DIR, ignore_errors=True)
    os.mkdir(JOB_DIR, 0o700)
    os.chown(JOB_DIR, uid, uid)


def _sweep(deadline_s: float = 2.0) -> None:
    """Kill and reap everything in the slot but itself (pid 1 is spared by kill(-1))."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            _reap_nowait()
            return
        if not _reap_nowait():
            time.sleep(0.0002)


def _make_spare(channel: Channel) -> tuple[int, socket.socket]:
    """Fork a spare holder (``spare_holder``) for the next session."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        spare_holder(theirs, channel)
    theirs.close()
    return pid, ours


def _hand_over(spare: tuple[int, socket.socket], data: bytes) -> int:
    """Give the spare its session (``data``: the open request); its pid, or 0 if it is gone."""
    pid, chan = spare
    try:
        chan.send(data)
    except OSError:
        with _suppress():
            os.kill(pid, signal.SIGKILL)
        pid = 0
    chan.close()
    return pid


def _drain(fd: int) -> None:
    """Throw away whatever waits in the request pipe (a request the last session never read)."""
    os.set_blocking(fd, False)
    try:
        while os.read(fd, 1 << 16):
            pass
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)


def enter_slot(uid: int, ctl: socket.socket, program: Filter, channel: Channel) -> None:
    """The slot's own set-up: a private /tmp and /proc, the sessions' environment, then the filter.

    The filter is installed here, once, so every session inherits it (installing one per process
    costs more than the rest of a session's set-up); the slot itself needs none of what it denies."""
    _close_all_but(ctl.fileno(), *channel)  # e.g. fds the server held when it forked us
    opts = f"size={TMPFS_BYTES},nr_inodes=4096,mode=0755"
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.environ.clear()
    os.environ.update(SESSION_ENV)
    _fresh_job_dir(uid)
    seccomp_filter(program)


def slot(uid: int, ctl: socket.socket, program: Filter, channel: Channel) -> NoReturn:
    """Pid 1 of one uid's pid namespace: runs that uid's sessions, one at a time.

    A session is a fork of this process (its holder; a spare one is made while the slot is idle).
    When the holder ends -- the pool closed the session, asked for a kill, or it died -- everything
    it left is killed, the job dir emptied, and ``ended`` goes back with how the holder ended."""
    enter_slot(uid, ctl, program, channel)
    current: tuple[str, int, int] | None = None
    """The running session: (id, its holder's pid, a pidfd of the holder)."""
    spare: tuple[int, socket.socket] | None = _make_spare(channel)
    """A holder made ahead of the next session (still root, waiting): its pid and channel."""
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    while True:
        events = poller.poll(REAP_EVERY_S * 1000 if current is not None else None)
        for pid, _status, _usage in _reap_nowait() if current is None else []:
            if spare is not None and pid == spare[0]:  # a spare that died (or was killed)
                spare[1].close()
                spare = None
        for fd, _event in events:
            if current is not None and fd == current[2]:
                poller.unregister(fd)
                os.close(fd)
                _pid, status, usage = os.wait4(current[1], 0)
                _sweep()
                _fresh_job_dir(uid)
                ended = {"kind": "ended", "id": current[0], "cpu_s": usage.ru_utime + usage.ru_stime}
                ended["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
                ended["exit_code"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
                ctl.send(json.dumps(ended).encode())
                current, spare = None, _make_spare(channel)
                continue
            if fd != ctl.fileno():
                continue
            data = ctl.recv(1 << 16)
            if not data:
                os._exit(0)  # the server is gone: the kernel kills everything in the slot with us
            message = json.loads(data)
            sid = str(message["id"])
            if message["op"] == "kill":
                if current is not None and current[0] == sid:
                    with _suppress():
                        os.kill(current[1], signal.SIGKILL)
            elif current is not None:
                ctl.send(json.dumps({"kind": "ended", "id": sid, "error": "the slot is busy"}).encode())
            else:
                _drain(channel[0])  # the pool writes nothing more until the holder says it is ready
                pid = _hand_over(spare, data) if spare is not None else 0
                spare = None
                if not pid:  # no spare, or it died before it could take the session
                    pid = os.fork()
                    if pid == 0:
                        holder(message, channel)
                current = (sid, pid, os.pidfd_open(pid))
                poller.register(current[2], select.POLLIN)
        if current is not None:
            _reap_nowait_except(current[1])


def _reap_nowait_except(keep: int) -> None:
    """Reap the zombies a running session left (reparented to the slot), never its holder."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        with _suppress():
            os.waitpid(info.si_pid, 0)


def spawn_slot(uid: int, close: list[int], program: Filter, channel: Channel) -> tuple[int, socket.socket]:
    """Fork a slot (pid 1 of fresh pid/mount/ipc namespaces) for ``uid``: its pid here and its socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    report_r, report_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(report_r)
        try:
            for fd in [*close, ours.fileno()]:
                os.close(fd)
            _check(_libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC), "unshare")
            first = os.fork()
            if first == 0:
                os.close(report_w)
                try:
                    slot(uid, theirs, program, channel)
                except BaseException:
                    os._exit(70)
            os.write(report_w, str(first).encode())
        except BaseException as exc:
            os.write(report_w, ("!" + _one_line(exc)).encode())
        os._exit(0)
    os.close(report_w)
    theirs.close()
    report = b""
    while chunk := os.read(report_r, 4096):
        report += chunk
    os.close(report_r)
    os.waitpid(middle, 0)
    text = report.decode(errors="replace")
    if not text or text.startswith("!"):
        ours.close()
        raise SetupError(text[1:] or "the slot's process ended before it started")
    return int(text), ours


# --------------------------------------------------------------------------- the server


class _Slot:
    def __init__(self, uid: int, pid: int, sock: socket.socket) -> None:
        self.uid = uid
        self.pid = pid
        self.sock = sock
        self.pidfd = os.pidfd_open(pid)
        self.sessions: set[str] = set()


def server(ctl: socket.socket, program: Filter) -> NoReturn:
    """Pid 1 of the sandbox: a slot per uid, sessions opened and killed in them on request."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    slots: dict[int, _Slot] = {}
    by_fd: dict[int, _Slot] = {}
    session_uid: dict[str, int] = {}
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    ctl.send(json.dumps({"kind": "ready"}).encode())

    def drop(slot_: _Slot, why: str) -> None:
        for sid in slot_.sessions:
            session_uid.pop(sid, None)
            ctl.send(json.dumps({"kind": "ended", "id": sid, "error": why}).encode())
        for fd in (slot_.sock.fileno(), slot_.pidfd):
            poller.unregister(fd)
            by_fd.pop(fd, None)
        with _suppress():
            os.kill(slot_.pid, signal.SIGKILL)
        with _suppress():
            os.waitpid(slot_.pid, 0)
        os.close(slot_.pidfd)
        slot_.sock.close()
        slots.pop(slot_.uid, None)

    while True:
        for fd, _event in poller.poll():
            if fd == ctl.fileno():
                _from_pool(ctl, slots, by_fd, session_uid, poller, program)
                continue
            owner = by_fd.get(fd)
            if owner is None:
                continue
            if fd == owner.pidfd:
                drop(owner, "the sandbox slot ended unexpectedly")
                continue
            data = owner.sock.recv(1 << 16)
            if not data:
                drop(owner, "the sandbox slot closed")
                continue
            sid = str(json.loads(data).get("id"))
            owner.sessions.discard(sid)
            session_uid.pop(sid, None)
            ctl.send(data)


def _from_pool(
    ctl: socket.socket,
    slots: dict[int, _Slot],
    by_fd: dict[int, _Slot],
    session_uid: dict[str, int],
    poller: select.poll,
    program: Filter,
) -> None:
    """One request of the pool: make a slot for a uid (with its pipes), open a session in it, or kill one."""
    data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 2)
    if not data:
        for owner in slots.values():
            with _suppress():
                os.kill(owner.pid, signal.SIGKILL)
        os._exit(0)
    message = json.loads(data)
    op, sid = message.get("op"), str(message.get("id"))
    try:
        if op == "slot":
            uid = int(message["uid"])
            if uid in slots or len(fds) != 2:
                raise SetupError(f"a slot for uid {uid} exists, or it came without its two pipes")
            pid, sock = spawn_slot(uid, [ctl.fileno(), *by_fd], program, (fds[0], fds[1]))
            slots[uid] = owner = _Slot(uid, pid, sock)
            for fd in (sock.fileno(), owner.pidfd):
                by_fd[fd] = owner
                poller.register(fd, select.POLLIN)
            ctl.send(json.dumps({"kind": "slot", "uid": uid}).encode())
        elif op == "kill":
            uid = session_uid.get(sid, -1)
            if uid in slots:
                slots[uid].sock.send(data)
        else:
            uid = int(message["uid"])
            if uid not in slots:
                raise SetupError(f"no slot for uid {uid}")
            slots[uid].sessions.add(sid)
            session_uid[sid] = uid
            slots[uid].sock.send(data)
    except (SetupError, OSError, KeyError, ValueError) as exc:
        kind = "slot_error" if op == "slot" else "ended"
        ctl.send(
            json.dumps({"kind": kind, "id": sid, "uid": message.get("uid"), "error": _one_line(exc)}).encode()
        )
    finally:
        for fd in fds:
            os.close(fd)


def preload(spec: dict[str, Any]) -> None:
    """Import a pool's preload once, here, so every session forks with it already imported."""
    if not spec.get("modules"):
        return  # a pool without one starts as it always did
    os.environ.update(spec.get("env", {}))
    for name in spec.get("modules", []):
        try:
            import_module(name)
        except BaseException as exc:
            raise SetupError(f"preloading {name}: {_one_line(exc)}") from exc
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a fork keeps only the calling thread: a thread pool's locks would be left held
        raise SetupError(f"preloading {spec.get('modules')} started {threads - 1} thread(s); sessions fork")


def main() -> None:
    ctl_fd = int(sys.argv[1])
    spec = json.loads(sys.argv[2])
    sys.path.extend(sys.argv[3:])  # site-packages, without running site's .pth hooks (-S)
    ctl = socket.socket(fileno=ctl_fd)
    try:
        if os.geteuid() != 0:
            raise SetupError("the sandbox fork server must start as root")
        for name in PRELOAD:
            import_module(name)
        program = build_filter()
        # The preload's directories go first, as the sessions that import from them put them, but only
        # after the server's own imports; on sys.path before the namespaces, so they stay visible there.
        sys.path[:0] = spec.get("paths", [])
        build_namespaces()
        preload(spec)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        child = os.fork()
    except (SetupError, OSError) as exc:
        ctl.send(json.dumps({"kind": "setup_error", "error": str(exc)}).encode())
        os._exit(70)
    if child == 0:
        try:
            server(ctl, program)
        except BaseException as exc:
            with _suppress():
                ctl.send(
                    json.dumps({"kind": "setup_error", "error": f"sandbox server: {_one_line(exc)}"}).encode()
                )
            os._exit(70)
    ctl.close()
    os.waitpid(child, 0)
    os._exit(0)


if __name__ == "__main__":
    main()
