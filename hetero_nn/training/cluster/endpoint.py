"""Messages between the processes of a cluster run, over ``distributed``'s TCP comms.

This module owns the transport of the cluster path (:mod:`hetero_nn.training.cluster`):
an :class:`Endpoint` per process (the client, each worker's rank) with a listener,
persistent connections to the peers it talks to, and an asyncio loop in a thread of
its own, so that messages go straight from process to process, never through the
Dask scheduler, and a rank's compute threads never wait on the loop of the Dask
worker that hosts it.

Policy
------
A message is a dict; NumPy arrays in it travel as frames of their own
(``distributed.protocol.to_serialize``), not pickled. :meth:`Endpoint.post` is
thread-safe and returns at once: the message joins the link's queue, which one
writer coroutine per link drains in order (two writes on one comm would interleave
their frames). Each link has one reader coroutine that hands every message, in
arrival order, to ``on_message(peer, message)`` *on the loop thread* (keep it
short: a dict update and a notify). A link that closes or fails (the peer process
died, SIGKILL included: the kernel closes its sockets) calls ``on_closed(peer)``
once. Links are named by the peer: ``connect(name, address)`` opens an outgoing
one (its first message says who we are), and a peer that connects to us is known
by the name it gives; :meth:`post` uses the outgoing link to a name if there is
one, else the incoming one (the client's commands come in on a link the rank
answers on, so a client behind a firewall needs no listener of its own).

State: ``_links``, peer name -> :class:`_Link` (outgoing first); ``loop``; the
listener; ``closed``.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Endpoint"]

#: Seconds a connection to a peer may take.
CONNECT_TIMEOUT = 10.0


def serialized(obj):
    """``obj`` as a message part that travels out of band: an array as frames, a state
    pickled with its arrays as frames (``distributed.protocol.to_serialize``)."""
    # distributed loads with the first cluster (heavy at start-up)
    from distributed.protocol import to_serialize
    return to_serialize(obj)


class _Link:
    """One comm to one peer: a send queue drained by a writer, a reader."""

    __slots__ = ("name", "comm", "queue", "tasks", "outgoing", "dead")

    def __init__(self, name, comm, outgoing):
        self.name, self.comm, self.outgoing = name, comm, outgoing
        self.queue = asyncio.Queue()
        self.tasks = []
        self.dead = False


class Endpoint:
    """A process's messaging endpoint (see the module docstring).

    Parameters
    ----------
    name : str
        How this endpoint introduces itself on the links it opens.
    host : str
        The interface to listen on (the Dask worker's host for a rank).
    on_message : callable(peer, message)
        Called on the endpoint's loop thread for every message received.
    on_closed : callable(peer), optional
        Called once on the loop thread when the link to ``peer`` closes or fails.
    """

    def __init__(self, name, host, on_message, on_closed=None):
        # distributed loads with the first cluster (heavy at start-up)
        from distributed.comm import listen

        self.name = name
        self.on_message = on_message
        self.on_closed = on_closed
        self.closed = False
        self._links: dict[str, list[_Link]] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name=f"hetero_nn-endpoint-{name}")
        self._thread.start()

        async def start():
            listener = listen(f"tcp://{host}:0", self._serve, deserialize=True)
            await listener.start()
            return listener

        try:
            self._listener = self._call(start(), CONNECT_TIMEOUT)
        except BaseException:
            self._stop_loop()
            raise
        self.address = self._listener.contact_address

    # ------------------------------------------------------------ the loop
    def _call(self, coro, timeout):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _start(self, link):
        link.tasks = [self.loop.create_task(self._read(link)),
                      self.loop.create_task(self._write(link))]
        self._links.setdefault(link.name, []).append(link)
        self._links[link.name].sort(key=lambda x: not x.outgoing)

    async def _serve(self, comm):
        """An incoming link: its first message names the peer."""
        try:
            hello = await comm.read()
        except Exception:
            comm.abort()
            return
        self._start(_Link(str(hello.get("name")), comm, outgoing=False))

    async def _read(self, link):
        try:
            while True:
                message = await link.comm.read()
                self.on_message(link.name, message)
        except Exception:  # closed, reset, or a message that failed to deserialize
            pass
        self._lost(link)

    async def _write(self, link):
        try:
            while True:
                message = await link.queue.get()
                if message is None:
                    break
                await link.comm.write(message)
        except Exception:
            self._lost(link)

    def _lost(self, link):
        if link.dead:
            return
        link.dead = True
        link.comm.abort()
        for task in link.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        links = self._links.get(link.name, [])
        if link in links:
            links.remove(link)
        if not links:
            self._links.pop(link.name, None)
        if self.on_closed is not None and not self.closed:
            self.on_closed(link.name)

    # ------------------------------------------------------------ public
    def connect(self, name, address, timeout=CONNECT_TIMEOUT):
        """Open a link to the endpoint at ``address``, known here as ``name`` (blocks)."""
        # distributed loads with the first cluster (heavy at start-up)
        from distributed.comm import connect

        async def dial():
            comm = await connect(address, timeout=timeout, deserialize=True)
            await comm.write({"name": self.name})
            self._start(_Link(name, comm, outgoing=True))

        self._call(dial(), timeout + 5)

    def post(self, name, message):
        """Queue ``message`` for the peer ``name`` (from any thread; returns at once). A
        message to a peer without a live link is dropped: the loss of a link is told by
        ``on_closed``, and the callers wait for answers with that in mind."""
        def put():
            links = self._links.get(name)
            if links:
                links[0].queue.put_nowait(message)

        if not self.closed:
            self.loop.call_soon_threadsafe(put)

    def peers(self) -> list[str]:
        """Names of the peers with a live link."""
        return list(self._links)

    def disconnect(self, name):
        """Close the links to ``name`` (no ``on_closed`` call for them)."""
        async def drop():
            for link in list(self._links.pop(name, [])):
                link.dead = True
                link.queue.put_nowait(None)
                for task in link.tasks:
                    task.cancel()
                link.comm.abort()

        if not self.closed:
            try:
                self._call(drop(), 10.0)
            except Exception:
                pass

    def close(self):
        """Close every link and the listener, and stop the loop thread."""
        if self.closed:
            return
        self.closed = True

        async def shutdown():
            self._listener.stop()
            for links in list(self._links.values()):
                for link in links:
                    link.dead = True
                    for task in link.tasks:
                        task.cancel()
                    link.comm.abort()
            self._links.clear()

        try:
            self._call(shutdown(), 10.0)
        except Exception:
            pass
        self._stop_loop()

    def _stop_loop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(10.0)

    def __repr__(self):
        return f"Endpoint({self.name!r}, {self.address!r}, peers={self.peers()})"

