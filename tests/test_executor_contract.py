"""One execution contract (hetero_nn/scheduler/executors/contract.py): the local, sync, Dask
and compiled executors answer the same ``replay(graph)``, and which of them serves a
runtime's replays is the one rule the simulator asks too. (A hung wait stops at the
runtime's ``wait_timeout``.)"""

import numpy as np
import pytest

import hetero_nn as hn
from hetero_nn import R, RW
from hetero_nn.scheduler.engine.executor import CompiledExecutor, replay_executor
from hetero_nn.scheduler.executors.contract import Executor
from hetero_nn.simulation.paths import engine_serves
from hetero_nn.simulation.machine import Platform


def _axpy(y, x, a):
    y *= a
    y += x


AXPY = hn.Codelet("contract_axpy", modes=(RW, R), variants={"ref": _axpy})


def _replayed(executor, replay_engine=None):
    """``y`` after a capture and two replays of four dependent tasks on two handles."""
    with hn.Runtime(devices="cpu:2", executor=executor, perfmodel=False,
                    replay_engine=replay_engine) as rt:
        y, x = rt.register(np.linspace(0.0, 1.0, 8)), rt.register(np.full(8, 0.1))
        with rt.capture() as graph:
            for i in range(4):
                rt.submit(AXPY, y if i % 2 == 0 else x, x if i % 2 == 0 else y,
                          a=graph.param(f"a{i}", 0.5 + i))
        graph.replay(a0=0.25, a1=1.5, a2=0.75, a3=2.0)
        graph.replay()
        serving = replay_executor(rt)
        compiled = graph._compiled is not None
        assert isinstance(rt.compiled, CompiledExecutor) and isinstance(rt.executor, Executor)
        return rt.fetch(y, copy=True), serving is rt.compiled, compiled


def _reference():
    """The same capture run and two replays in NumPy."""
    y, x = np.linspace(0.0, 1.0, 8), np.full(8, 0.1)
    for params in ((0.5, 1.5, 2.5, 3.5), (0.25, 1.5, 0.75, 2.0), (0.25, 1.5, 0.75, 2.0)):
        for i, a in enumerate(params):
            _axpy(*((y, x) if i % 2 == 0 else (x, y)), a)
    return y


def test_every_executor_replays_through_the_same_call_to_the_same_bits():
    """(The sync executor ran a closed DAG's roots only before the contract's test.)"""
    results = {name: _replayed(name) for name in ("local", "sync", "dask")}
    results["local, replay_engine='executor'"] = _replayed("local", "executor")
    assert results["local"][1:] == (True, True)  # the compiled executor served it
    for name, (_, served_compiled, compiled) in results.items():
        if name != "local":
            assert (served_compiled, compiled) == (False, False), name
    for name, (y, _, _) in results.items():
        np.testing.assert_array_equal(y, _reference(), err_msg=name)


@pytest.mark.parametrize("devices", ["cpu:2", "cpu:1,cuda-emu:1"])
@pytest.mark.parametrize("policy", ["eager", "dmda", "heft"])
def test_the_runtime_serves_replays_where_the_simulator_predicts_the_engine(devices, policy):
    with hn.Runtime(devices=devices, policy=policy, perfmodel=False, trace=False) as rt:
        assert (replay_executor(rt) is rt.compiled) == \
            engine_serves(Platform.from_devices(devices), policy)
        assert replay_executor(rt) is (rt.compiled if rt.compiled.refusal() is None
                                       else rt.executor)
