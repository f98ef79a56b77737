"""Automatic capture: a flush submitted again in the same shape is replayed without
``rt.capture()`` (Legion's trace auto-detection, Apophenia).

Policy
------
A flush's *shape* is the sequence of its submissions: per task the codelet, the handles
(the same objects), the ``modes`` given and the parameters by name, each equal in type and
value (a float's sign of zero included, tuples element by element), but for *step parameters*
(:meth:`Runtime.param <hetero_nn.scheduler.runtime.Runtime.param>`), matched by name
(one value per name in a flush). Only plain parameters take part (``int``, ``float``,
``str``, ``bool``, None, tuples of them); a flush with another kind (an array), a task
given ``priority``, ``after``, ``callback`` or ``worker``, one submitted inside
``placing()``, a capture, a recording or ``combining_with``, or an ``add_dependency``
has no shape, and so has one on a temporary handle (a flush's own). Only the local
executor is served.

- A flush of a new shape runs as submitted; its submissions are kept (one append per
  task: the arguments as given).
- A flush that starts with the first submission of a known shape is *deferred*: each
  submission is compared with the one at its position in the shape (the check is
  incremental, per task, and stops at the first difference) and kept, unrun; ``submit``
  returns its :class:`~.task.Task`. A submission whose parameters are the very objects
  of the shape's call (a program passing the same values again; ``Runtime.param`` gives
  the object it gave last for an equal value) costs one identity test per parameter and
  brings no step value: the shape's objects hold its graph's values (after a capture,
  its calls copied; after a replay that compared in type and value, that flush's calls).
  Where a step value seen differs from the graph's, and at a capture, the kept tasks are
  compared again in type and value at ``wait()`` (one value per name, all names known)
  unless each was compared so already. At ``wait()`` (``fetch``, ``Task.wait``) a complete
  match runs as a graph: the shape's second occurrence is captured (a
  :class:`~.capture.Graph` whose capture runs it), later ones replay that graph, the step
  parameters whose value changed given to ``replay``. A submission that differs, a flush
  that ends early, an ``add_dependency``, or a ``placing()`` or ``combining_with`` block
  opened meanwhile submits the deferred tasks as the program did (outside that block),
  in order, and the flush goes on as a new shape. Which shape a flush is compared with:
  the one that followed the previous flush's shape last time, if it starts the same way,
  else the last one seen starting that way; at a difference, another of the last
  :data:`ALIKE` shapes starting that way that has the kept tasks and the submission, and
  at a flush that ends early, one that has exactly the kept tasks (a shape that is a
  prefix of the one compared with is replayed, not submitted).
- Early replays (:mod:`~.engine.early`): where the shape's graph is steady on the engine
  and has at least :data:`EARLY_MIN` tasks, its replay starts once :data:`EARLY_AT` kept
  submissions matched (with the graph's step values: a submission bringing another one
  leaves the shape) and runs the matched prefix while the rest is submitted; ``wait()``
  finishes it. A flush that leaves the shape after the start stops it, and only the kept
  tasks it did not run are submitted (no other shape is looked for then).
- Cost bounds: after :data:`MISS_BUDGET` flushes in a row of new shapes (or none) with no
  replay, the runtime stops looking (a program whose flushes never repeat, e.g. steps on
  fresh temporaries, pays the appends of that many flushes); at most :data:`MAX_SHAPES`
  shapes are kept (the least recently used dropped, with its graph), of at most
  :data:`MAX_TASKS` submissions.

Results are those of explicit capture, which are the submitted flush's bits
(``tests/test_autocapture.py``). What differs: a deferred flush starts at ``wait()``
(or early), not while it is submitted (as with ``overlap=False``; ``Task.done()`` on a kept task
submits its flush as the program did, so a program that polls sees its tasks end); a
replay's trace records carry the kept
tasks' ids (in the graph's order where it holds REDUX trees or fused chains).
``rt.trace().metadata["auto_capture"]`` says, per flush the runtime captured or replayed
by itself, its generation, what it did and its tasks, and ``early`` where it replayed
early (no key where there is none).

State
-----
``on``: looking (False: ``Runtime(auto_capture=False)`` or the miss budget spent);
``state``: :data:`IDLE` between flushes, :data:`RECORD` (``calls``: the flush's
submissions so far), :data:`DEFER` (``shape``: the one compared with; ``deferred``: the
tasks kept; ``steps``: step parameter values seen; ``compared``: how many kept tasks
were compared in type and value, the others having had the shape's objects), :data:`NONE` (the flush has no
shape); ``shapes``: first call ``(codelet, handles)`` -> the last :data:`ALIKE`
:class:`Shape` objects starting that way, newest first (keys in least recently used
order); ``last``: the previous flush's shape; ``misses``; ``notes``: the trace's log;
``busy``: the runtime's own submissions (a fallback, a capture) under way, not looked at;
``params``: per step parameter name, the last one :meth:`AutoCapture.param` made;
``collector``: a kept flush's share of the garbage collector's raised threshold (from
the first kept task to ``wait()`` or a fallback, as an open flush holds one:
``flush.Collector``; a young collection per 700 kept tasks cost up to 0.5 us a task);
``early``: the shape's :class:`~.engine.early.EarlyReplay` under way, and ``mark``: the
kept count at which it starts or its gate is raised next (0: never).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict, deque

from ..errors import SubmitError
from .capture import Graph
from .engine.early import STEP, EarlyReplay
from .engine.early import refusal as early_refusal
from .engine.replay import FloatParam, IntParam, step_param
from .flush import CollectorShare
from .task import Task

#: Flushes in a row of new shapes, with no replay, after which the runtime stops looking.
MISS_BUDGET = 16
#: Shapes kept (each may hold a captured graph and its temporaries).
MAX_SHAPES = 8
#: Shapes kept per first submission (a step of several flushes that start alike).
ALIKE = 4
#: Submissions a flush may have and still be kept as a shape.
MAX_TASKS = 1 << 16
#: Kept submissions matched before the shape's graph starts to replay (an early replay).
EARLY_AT = 16
#: Submissions a shape must have for its graph to replay early.
EARLY_MIN = 64

IDLE, RECORD, DEFER, NONE = 0, 1, 2, 3

_perf = time.perf_counter
_STEPS = (FloatParam, IntParam)
_PLAIN = (int, float, str, bool, type(None))
_new_task = Task.__new__


class Shape:
    """One flush's submissions, ``calls``: ``(codelet, handles, modes, params)`` each (after
    a replay, the replayed flush's: equal to the first ones but for the step parameters'
    values); ``roots``, once :meth:`ready`, its handles' roots (all still registered, or the
    shape is dropped); ``graph`` once captured; ``values``: the step parameters' values the
    graph holds; ``next``: the shape that followed it."""

    __slots__ = ("calls", "roots", "graph", "values", "next")

    def __init__(self, calls):
        self.calls = calls
        self.roots = None
        self.graph = None
        self.values: dict = {}
        self.next = None

    def ready(self, rt) -> bool:
        """Whether the shape may be matched: its handles registered on ``rt``, none a
        temporary, its parameters plain (checked the first time it is seen again)."""
        if self.roots is None:
            roots = {}
            for _, handles, _, params in self.calls:
                for h in handles:
                    if h.temporary or h.root.temporary:  # one flush's: never the same again
                        return False
                    roots[h.root] = None
                if not all(map(_plain, params.values())):
                    return False
            self.roots = list(roots)
        return all(r.owner is rt for r in self.roots)


class AutoCapture:
    """One runtime's detection of repeated flushes (see the module docstring)."""

    def __init__(self, runtime, on: bool):
        self.rt = runtime
        self.on = bool(on) and runtime.executor_name == "local"
        self.state = IDLE
        self.calls: list | None = None
        self.room = 0  # calls the flush may still record
        self.shape = None
        self.deferred: list = []
        self.steps: dict = {}
        self.compared = 0  # kept tasks compared in type and value (not the shape's objects)
        self.early = None  # the shape's graph replaying while the flush is kept (EarlyReplay)
        self.mark = 0  # kept tasks at which _reached starts or advances it (0: never)
        self.params: dict = {}  # step parameter name -> the last one made (param)
        self.shapes: OrderedDict = OrderedDict()
        self.last = None
        self.misses = 0
        self.busy = False
        self.collector = CollectorShare()  # the raised threshold, while a flush is kept
        self.notes: deque = deque(maxlen=runtime._trace.flushes)

    # ------------------------------------------------------------------ submissions
    def submit(self, codelet, handles, modes, params):
        """A program's submission without task options: its :class:`Task` when deferred,
        else None (the runtime submits it)."""
        state = self.state
        rt = self.rt
        if state == DEFER and (rt._placing is not None or rt._reductions.across is not None):
            self.fall_back()  # a placing() or combining_with block opened (_context, inline)
            self.state = NONE
            return None
        if state == DEFER:
            deferred = self.deferred
            k = len(deferred)
            shape = self.shape
            calls = shape.calls
            same = False
            if k < len(calls):
                c, h, m, p = calls[k]
                if c is codelet and h == handles and m is modes and len(p) == len(params):
                    same = True  # every parameter the very object of the shape's call
                    try:
                        for key, w in p.items():
                            if params[key] is not w:
                                same = False
                                break
                    except KeyError:
                        same = False
                if not same:  # compared in type and value (a step parameter by name)
                    same = self._same(shape, k, codelet, handles, modes, params)
                    self.compared += 1
                    if same and self.early is not None and self.steps and \
                            not self._graph_values():
                        same = False  # the replay under way has another value: stopped
            if same or (self.early is None and self._switch(k, (codelet, handles, modes,
                                                                 params))):
                task = _new_task(Task)  # completed by Task.__init__ if it falls back
                task.id = next(rt._ids)
                task.codelet = codelet
                task.handles = handles
                task.modes = modes
                task.params = params
                task.runtime = rt
                task.ended = False
                task.error = task.failure = None
                # what a program or the runtime's queries may read of a kept task
                task.variant = task.worker = task._fp = None
                task.t_submit = task.t_ready = task.t_start = task.t_end = 0.0
                deferred.append(task)
                if k + 1 == self.mark:
                    self._reached(k + 1)
                return task
            self.fall_back()
            state = RECORD
        if state == RECORD:
            self.calls.append((codelet, handles, modes, params))
            self.room -= 1  # no call per task: a counter
            if not self.room:
                self.state = NONE
            return None
        if state == NONE or self.busy:
            return None
        return self._begin(codelet, handles, modes, params)

    def _begin(self, codelet, handles, modes, params):
        """The flush's first submission: defer it against a known shape, or record."""
        rt = self.rt
        flushes = rt._flushes
        if (flushes.capturing is not None or flushes.sink is not None or flushes.open
                or rt._placing is not None or rt._reductions.across is not None):
            self.state = NONE
            return None
        key = (codelet, handles)
        shape = self.last.next if self.last is not None else None
        if shape is None or shape.calls[0][0] is not codelet or shape.calls[0][1] != handles:
            alike = self.shapes.get(key)
            shape = alike[0] if alike else None
        if shape is not None and not shape.ready(rt):
            self._drop(shape)  # not plain, or a handle unregistered since (submitted: refused)
            shape = None
        if shape is not None:
            if key in self.shapes:  # (a shape reached as the last one's next may be evicted)
                self.shapes.move_to_end(key)
            self.state = DEFER
            self.shape = shape
            self.steps = {}
            self.compared = 0
            self.mark = EARLY_AT if shape.graph is not None and \
                len(shape.calls) >= EARLY_MIN else 0
            self.collector.hold()  # kept tasks live until wait(), as an open flush's
            return self.submit(codelet, handles, modes, params)
        self.state = RECORD
        self.calls = [(codelet, handles, modes, params)]
        self.room = MAX_TASKS
        return None

    def _switch(self, k, call=None) -> bool:
        """At a difference from the shape compared with (``call``: the ``k``-th submission,
        ``(codelet, handles, modes, params)``), or where the flush ends after ``k`` kept
        tasks (``call`` None): whether another shape starting the same way has the kept
        tasks and ``call`` (or exactly ``k`` calls); it is compared with then."""
        first = self.deferred[0] if self.deferred else None
        key = (call[0], call[1]) if first is None else (first.codelet, first.handles)
        current = self.shape
        for shape in self.shapes.get(key, ()):
            n = len(shape.calls)
            if shape is current or (n <= k if call is not None else n != k) \
                    or not shape.ready(self.rt):
                continue
            self.steps, self.shape, self.compared = {}, shape, k + (call is not None)
            if all(self._same(shape, i, t.codelet, t.handles, t.modes, t.params)
                   for i, t in enumerate(self.deferred)) and \
                    (call is None or self._same(shape, k, *call)):
                if call is not None and shape.graph is not None and len(shape.calls) >= EARLY_MIN:
                    self.mark = max(k + 1, EARLY_AT)  # its early replay: from here on
                return True
        self.shape = current
        return False

    def _reached(self, count):
        """``count`` kept tasks matched: the early replay's gate raised, or the replay
        started where it may (:mod:`~.engine.early`)."""
        early = self.early
        if early is not None:
            early.advance(count)
        elif self.shape.graph is not None and self._graph_values() and \
                early_refusal(self.rt, self.shape.graph, len(self.shape.calls)) is None:
            self.early = EarlyReplay(self.rt, self.shape.graph, self.deferred[0].id, count)
        else:
            self.mark = 0
            return
        self.mark = count + STEP

    def _graph_values(self) -> bool:
        """Whether the step values seen are those the shape's graph holds (the kept tasks
        whose parameters are the shape's objects bring none: they are the graph's)."""
        values = self.shape.values
        return all(n in values and _equal_typed(values[n], v) for n, v in self.steps.items())

    def _same(self, shape, k, codelet, handles, modes, params) -> bool:
        """Whether a submission is the shape's ``k``-th: parameters by name, each the very
        object recorded, or equal in type and value; step parameters by their name (their
        values kept in ``steps``: one per name in a flush)."""
        c, h, m, p = shape.calls[k]
        if c is not codelet or h != handles or (m is not modes and m != modes) \
                or len(p) != len(params):
            return False
        for key, w in p.items():  # one test per parameter where the program passes the
            if key not in params:  # same objects again (no tuple of types built per task)
                return False
            v = params[key]
            t = type(w)
            if v is w and t is not IntParam and t is not FloatParam:
                continue  # (a step parameter's value goes to ``steps`` even so)
            if type(v) is not t:
                return False
            if t is int or t is str:
                if v != w:
                    return False
            elif t is tuple:
                if v != w or tuple(map(type, v)) != tuple(map(type, w)) or (
                        float in map(type, v) and not _equal(v, w)):
                    return False
            elif t is FloatParam or t is IntParam:
                name = w.param_name
                if v.param_name != name:
                    return False
                seen = self.steps.setdefault(name, v)
                if seen is not v and not _equal(seen, v):
                    return False
            elif not _equal(v, w):
                return False
        return True

    # ------------------------------------------------------------------ flush ends
    def wait(self) -> bool:
        """At ``Runtime.wait``: True where the flush was run here (captured or replayed);
        otherwise the flush is the runtime's to run, and its shape is kept."""
        if self.busy:
            return False
        try:
            return self._wait()
        finally:
            self.collector.release()

    def _wait(self) -> bool:
        state = self.state
        if state == DEFER:
            k = len(self.deferred)
            if self.early is not None:  # replaying: only the whole shape finishes it
                if not self._context() and k == len(self.shape.calls):
                    return self._run()
            elif not self._context() and (k == len(self.shape.calls) or self._switch(k)) \
                    and self._steps_agree():
                return self._run()  # (a flush that ended early may be another shape's whole)
            state = NONE if self._context() else RECORD
            self.fall_back()
        shape = None
        if state == RECORD:
            shape = self._keep(self.calls)
        elif state == NONE:
            self._missed()
        self.state = IDLE
        self.calls = None
        self.last = shape
        return False

    def _steps_agree(self) -> bool:
        """Whether the kept flush has one value per step parameter name. A submission whose
        parameters are the shape's very objects brings no value to ``steps``: those objects
        hold the values the shape's graph has (``Shape.values``). So where a value seen
        differs from the graph's, or for a capture (which needs every name), each kept
        task is compared again in type and value, ``steps`` made anew (unless each was
        compared so already: then ``steps`` has every name, one value each)."""
        shape, steps = self.shape, self.steps
        if self.compared == len(self.deferred):  # each compared: every name seen, one value
            return True
        values = shape.values
        if shape.graph is not None and all(
                n in values and _equal_typed(values[n], v) for n, v in steps.items()):
            return True
        self.steps = {}
        return all(self._same(shape, i, t.codelet, t.handles, t.modes, t.params)
                   for i, t in enumerate(self.deferred))

    def _keep(self, calls):
        """Keep a flush's calls as a shape (checked when seen again: :meth:`Shape.ready`)."""
        shape = Shape(calls)
        if self.last is not None:
            self.last.next = shape
        key = (calls[0][0], calls[0][1])
        alike = self.shapes.pop(key, [])
        self.shapes[key] = [shape] + alike[:ALIKE - 1]
        while len(self.shapes) > MAX_SHAPES:
            self.shapes.popitem(last=False)
        self._missed()
        return shape

    def _missed(self):
        self.misses += 1
        if self.misses >= MISS_BUDGET:
            self.on = False  # the runtime's submit no longer calls in
            self.shapes.clear()
            self.last = None

    def _run(self) -> bool:
        """Capture or replay a flush that matched its shape completely."""
        rt = self.rt
        shape, tasks, steps, compared = self.shape, self.deferred, self.steps, self.compared
        early, self.early = self.early, None
        self.state, self.shape, self.deferred, self.steps = IDLE, None, [], {}
        graph = shape.graph
        if graph is not None and early is None:  # (an early replay checked them at its start)
            try:
                graph._check_roots(rt)
            except SubmitError:  # a handle unregistered since: submitted, refused as such
                self._drop(shape)
                self.deferred, self.state = tasks, DEFER
                self.fall_back()
                return self.wait()
        self.busy = True
        action = "captured" if graph is None else "replayed"
        try:
            if graph is None:
                # the calls compared with next: these, their parameters copied (a replay
                # rewrites the graph's step values in the submitted tasks' own)
                calls = [(t.codelet, t.handles, t.modes, dict(t.params)) for t in tasks]
                graph = Graph(rt)
                with graph:
                    for t in tasks:
                        self._submit(t)
                graph._params.update(steps)
                shape.graph, shape.values, shape.calls = graph, dict(steps), calls
            elif early is not None:  # the graph's values throughout (_reached, submit)
                early.finish()
            else:
                changed = {n: v for n, v in steps.items()
                           if not _equal_typed(shape.values.get(n), v)}
                shape.values.update(changed)
                rt._ids = itertools.count(tasks[0].id)  # the records take the kept tasks' ids
                graph.replay(**changed)
            if action == "replayed" and compared:  # the calls compared with next: these,
                # whose objects the next flush most likely passes again (one identity test)
                shape.calls = [(t.codelet, t.handles, t.modes, t.params) for t in tasks]
        except BaseException:
            if graph is not None and action == "replayed":
                for t in tasks:  # which one failed is the replay's TaskError's to say
                    t.error = "cancelled"
            raise
        finally:
            self.busy = False
            for t in tasks:
                t.ended = True
        note = {"flush": rt.generation - 1, "action": action, "tasks": len(tasks)}
        if early is not None:
            note["early"] = True
        self.notes.append(note)
        if self.last is not None:
            self.last.next = shape  # what followed it this time (compared with next time)
        self.misses = 0
        self.last = shape
        return True

    def fall_back(self):
        """Submit the deferred tasks as the program did (same tasks, same order); the flush
        goes on recorded as a new shape. Where the shape's graph replays early, it is
        stopped first, and the tasks it ran are not submitted again (the others are:
        :mod:`~.engine.early` says why that gives the same results)."""
        if self.state != DEFER:
            return
        tasks, self.deferred, self.shape = self.deferred, [], None
        early, self.early = self.early, None
        ran = ()
        if early is not None:
            try:
                ran = early.stop()
            except BaseException:  # a stall: what did not run is lost with the flush
                self.state = NONE
                self.collector.release()
                raise
        self.collector.release()  # (submitted now: the runtime's flush holds its own)
        self.state = RECORD
        self.calls = [(t.codelet, t.handles, t.modes, t.params) for t in tasks]
        self.room = MAX_TASKS - len(tasks) + 1
        rt = self.rt  # submitted in the context they were kept in: no placing, no across
        placing, across = rt._placing, rt._reductions.across
        rt._placing = rt._reductions.across = None
        self.busy = True
        try:
            for i, t in enumerate(tasks):
                if i < len(ran) and ran[i]:
                    t.ended = True  # run by the early replay
                else:
                    self._submit(t)
        finally:
            self.busy = False
            rt._placing, rt._reductions.across = placing, across

    def release(self):
        """A kept task's ``done()``: the program polls, so the flush runs as submitted
        (it gives up its replay) rather than wait for a ``wait()`` that may never come."""
        if self.state == DEFER and not self.busy:
            self.fall_back()

    def _context(self) -> bool:
        """Whether a ``placing()`` or ``combining_with`` block opened since the flush began
        (its kept tasks are then submitted, and the flush has no shape)."""
        rt = self.rt
        return rt._placing is not None or rt._reductions.across is not None

    def forget(self):
        """The flush needs its tasks as submitted (``add_dependency``): fall back, no shape."""
        if self.state == DEFER:
            self.fall_back()
        if self.state != IDLE:
            self.state = NONE

    def _submit(self, t):
        """Submit a deferred task through the runtime's path, as the program gave it."""
        modes = t.modes
        Task.__init__(t, t.id, t.codelet, t.handles, modes, t.params, _perf())
        t.runtime = self.rt
        self.rt._submit(t.codelet, t.handles, t.params, modes, task=t)

    def _drop(self, shape):
        for key, alike in list(self.shapes.items()):
            if shape in alike:
                alike.remove(shape)
                if not alike:
                    del self.shapes[key]
        if self.last is shape:
            self.last = None

    def param(self, name, value):
        """A step parameter outside a capture (:meth:`Runtime.param`): the one made last
        under ``name`` where ``value`` is the same in type and value, so that a flush
        passing it again is matched by one identity test per task; else a new one."""
        last = self.params.get(name)
        if last is not None and type(value) is last[0] and _equal(value, last[1]):
            return last[2]
        if len(self.params) >= MAX_SHAPES * ALIKE * 4:  # names made on the fly: bounded
            self.params.clear()
        made = step_param(name, value)
        self.params[name] = (type(value), value, made)
        return made

    def metadata(self, clear=False) -> dict:
        """What the trace says about the flushes captured or replayed here."""
        notes = list(self.notes)
        if clear:
            self.notes.clear()
        return {"auto_capture": notes} if notes else {}


def _plain(v) -> bool:
    t = type(v)
    if t is tuple:
        return all(_plain(x) for x in v)
    return t in _PLAIN or t in _STEPS


def _equal(v, w) -> bool:
    """Equal plain values of one type (a float's sign of zero included)."""
    if type(v) is tuple:
        return len(v) == len(w) and all(type(a) is type(b) and _equal(a, b)
                                        for a, b in zip(v, w))
    if v != w:
        return False
    return not isinstance(v, float) or v != 0.0 or math.copysign(1.0, v) == math.copysign(1.0, w)


def _equal_typed(v, w) -> bool:
    return type(v) is type(w) and _equal(v, w)
