"""A fork server for the docs' runnable blocks: one interpreter imports hetero_nn once,
and every block's Python process (a Python block, each ``hetero-nn`` command of a shell
block) is a fork of it instead of a new interpreter that imports it again.

Importing hetero_nn (NumPy, SciPy, Numba, Dask) is most of what a short block's process
costs: about 1.5 s on the CI machine, some 45 times over the default run's blocks.
``python docs_zygote.py serve SOCKET`` imports what the blocks import, checks that no
thread runs (a fork copies only the thread that forks), prints ``ready`` and serves;
``python docs_zygote.py run SCRIPT [ARG ...]``, or :func:`run_in_zygote` from a script
that imports nothing heavy, is the client. The client hands its standard streams, working
directory, environment and argv to the server; the fork runs the script as ``__main__``
there (``sys.path[0]`` its folder, as ``python SCRIPT`` has it), ends as an interpreter
does (non-daemon threads joined, ``atexit`` handlers run, streams flushed) and sends its
exit status back, which the client exits with. A client that goes away (a timeout killed
it) takes the fork's process group with it. This module imports only the standard
library at its top: the client must stay cheap.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

ENV = "HETERO_NN_DOCS_ZYGOTE"
"""The environment variable holding the server's socket path, for the clients."""
_LENGTH = struct.Struct("!I")
_STATUS = struct.Struct("!i")


def run_in_zygote(path, argv) -> int:
    """Run the script ``path`` with ``argv`` in a fork of the server; its exit status."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.environ[ENV])
        header = json.dumps({"path": os.path.abspath(path), "argv": list(argv),
                             "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        message = _LENGTH.pack(len(header)) + header
        sent = socket.send_fds(conn, [message], [0, 1, 2])
        conn.sendall(message[sent:])
        status = _read(conn, _STATUS.size)
    if status is None:
        print(f"docs_zygote: {path}: the forked process ended without an exit status",
              file=sys.stderr)
        return 1
    return _STATUS.unpack(status)[0]


def _read(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def serve(path) -> None:
    """Import what the blocks import, then fork a process per client (module docstring)."""
    import signal
    import threading

    import hetero_nn  # noqa: F401
    import hetero_nn.cli  # noqa: F401
    for name in ("train", "evaluate", "trace", "plot", "simulate", "models", "datasets",
                 "perfmodel"):
        __import__(f"hetero_nn.cli.{name}")
    for name in ("dask", "distributed", "matplotlib"):
        try:
            __import__(name)
        except ImportError:  # optional: a block that needs it imports it itself
            pass

    if threading.active_count() != 1:
        sys.exit(f"docs_zygote: {threading.active_count()} threads after the imports; a "
                 f"fork would copy only one")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the forks
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        sys.stdout.flush(), sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _child(conn)  # never returns
        conn.close()


def _child(conn):
    """In the fork: become the client's process, run its script, report, exit."""
    import atexit
    import signal
    import threading
    import traceback
    import types

    status = 1
    try:
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        (length,) = _LENGTH.unpack(message[:_LENGTH.size])
        header = message[_LENGTH.size:]
        header += _read(conn, length - len(header)) or b""
        request = json.loads(header)
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)

        def watch():  # the client gone (killed on a timeout): so is this process group
            if not conn.recv(1):
                os.killpg(0, signal.SIGKILL)
        threading.Thread(target=watch, daemon=True).start()

        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        path = request["path"]
        sys.argv = request["argv"]
        sys.path[0] = os.path.dirname(path)
        main = types.ModuleType("__main__")
        main.__file__, main.__spec__, main.__builtins__ = path, None, __builtins__
        sys.modules["__main__"] = main
        with open(path, encoding="utf-8") as file:
            code = compile(file.read(), path, "exec")
        try:
            exec(code, main.__dict__)
            status = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                status = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        for thread in threading.enumerate():  # as the interpreter does at its end
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            conn.sendall(_STATUS.pack(status))
        finally:
            os._exit(status & 0xFF)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["run"]:
        sys.exit(run_in_zygote(sys.argv[2], sys.argv[2:]))
    else:
        sys.exit("usage: docs_zygote.py serve SOCKET | run SCRIPT [ARG ...]")
