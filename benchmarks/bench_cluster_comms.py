"""Which of ``distributed``'s ways of talking between processes is cheapest for the cluster path.

Round trips between two worker processes of a ``LocalCluster`` (and from the
client), with a payload of 8 B, 64 KiB and 1 MiB (a float32 array each way):

- ``scheduler``: ``client.submit(f).result()`` of a no-op (what the old cluster path
  paid per block; the payload is the argument);
- ``client->actor``: an actor method call from the client (``actor.echo(x).result()``);
- ``actor->actor``: an actor method on worker A calling one on worker B;
- ``queue``: ``distributed.Queue`` put/get both ways (through the scheduler);
- ``comm``: :class:`hetero_nn.training.cluster.endpoint.Endpoint`, persistent TCP comms of
  ``distributed.comm`` between the two workers (what the cluster path uses).

Prints the median and the 90th percentile round trip per way and payload, in
microseconds; ``--json FILE`` keeps them. Example (a minute on 2 idle cores)::

    python benchmarks/bench_cluster_comms.py --trips 200 --json runs/bench_cluster_comms.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import threading
import time

import numpy as np

SIZES = {"8 B": 2, "64 KiB": 16 * 1024, "1 MiB": 256 * 1024}  # float32 elements
_perf = time.perf_counter


def _noop(x):
    return x


class Pinger:
    """An actor on one worker: echoes, pings other actors, serves queues and comms."""

    def __init__(self, name):
        from distributed import get_worker

        from hetero_nn.training.cluster.endpoint import Endpoint

        self.name = name
        self.reply = threading.Event()
        host = get_worker().address.split("://")[1].rsplit(":", 1)[0]
        self.endpoint = Endpoint(name, host, self._on_message)

    def address(self):
        return self.endpoint.address

    def _on_message(self, peer, message):
        from distributed.protocol import to_serialize

        if message["op"] == "ping":
            self.endpoint.post(peer, {"op": "pong", "v": to_serialize(message["v"])})
        else:
            self.reply.set()

    def echo(self, x):
        return x

    def ping_comm(self, peer, address, elements, trips):
        from distributed.protocol import to_serialize

        self.endpoint.connect(peer, address)
        x = np.ones(elements, np.float32)
        times = []
        for _ in range(trips):
            self.reply.clear()
            t0 = _perf()
            self.endpoint.post(peer, {"op": "ping", "v": to_serialize(x)})
            self.reply.wait(30)
            times.append(_perf() - t0)
        self.endpoint.disconnect(peer)
        return times

    def ping_actor(self, other, elements, trips):
        x = np.ones(elements, np.float32)
        times = []
        for _ in range(trips):
            t0 = _perf()
            other.echo(x).result()
            times.append(_perf() - t0)
        return times

    def serve_queue(self, trips):
        from distributed import Queue

        requests, replies = Queue("bench-requests"), Queue("bench-replies")
        for _ in range(trips):
            replies.put(requests.get())
        return trips

    def ping_queue(self, elements, trips):
        from distributed import Queue

        requests, replies = Queue("bench-requests"), Queue("bench-replies")
        x = np.ones(elements, np.float32)
        times = []
        for _ in range(trips):
            t0 = _perf()
            requests.put(x)
            replies.get()
            times.append(_perf() - t0)
        return times

    def close(self):
        self.endpoint.close()


def main(argv=None):
    import distributed

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trips", type=int, default=100)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    rows = []
    with (distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR) as lc,
          distributed.Client(lc) as client):
        a_addr, b_addr = sorted(client.nthreads())
        a = client.submit(Pinger, "a", actor=True, workers=[a_addr]).result()
        b = client.submit(Pinger, "b", actor=True, workers=[b_addr]).result()
        b_endpoint = b.address().result()
        for label, elements in SIZES.items():
            x = np.ones(elements, np.float32)
            ways = {}
            times = []
            for _ in range(args.trips):
                t0 = _perf()
                client.submit(_noop, x, pure=False, workers=[b_addr]).result()
                times.append(_perf() - t0)
            ways["scheduler"] = times
            times = []
            for _ in range(args.trips):
                t0 = _perf()
                b.echo(x).result()
                times.append(_perf() - t0)
            ways["client->actor"] = times
            ways["actor->actor"] = a.ping_actor(b, elements, args.trips).result()
            served = b.serve_queue(args.trips)
            ways["queue"] = a.ping_queue(elements, args.trips).result()
            served.result()
            ways["comm"] = a.ping_comm("b", b_endpoint, elements, args.trips).result()
            for way, times in ways.items():
                times = sorted(times[len(times) // 10:])  # the first tenth: warm-up
                row = {"way": way, "payload": label, "trips": len(times),
                       "median_us": 1e6 * statistics.median(times),
                       "p90_us": 1e6 * times[int(0.9 * (len(times) - 1))]}
                rows.append(row)
                print(f"{way:<14} {label:>7}  median {row['median_us']:9.0f} us   "
                      f"p90 {row['p90_us']:9.0f} us", flush=True)
        a.close().result()
        b.close().result()
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "args": vars(args), "load": os.getloadavg()}, f, indent=2)


if __name__ == "__main__":
    main()
