"""Helpers shared by the tests (importable because pytest puts tests/ on sys.path)."""

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from hetero_nn.codelets import padding

REPO = Path(__file__).resolve().parents[1]


def rel_err(actual, expected, floor=0.0) -> float:
    """Largest absolute difference relative to the largest magnitude of ``expected``, or
    to ``floor`` where that is larger: the size of the terms that cancel into
    ``expected`` (a normalization's input gradient over two values is rounding of terms
    of order ``|dy| |w| rstd``, and its own magnitude says nothing)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), floor, 1e-300)
    return float(np.max(np.abs(actual - expected), initial=0.0)) / scale


def pair(v):
    """An int or a pair as a pair (PyTorch's ``_pair``)."""
    return tuple(v) if isinstance(v, tuple) else (v, v)


def load_script(path):
    """The script at ``path`` (relative to the repository) as a fresh module, its
    ``main`` callable in-process."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cache_with_shared_trampolines(path) -> Path:
    """A new ``HETERO_NN_CACHE`` at ``path``, empty but for ``trampolines/``: the session's
    folder (conftest), so a subprocess on this cache loads the trampolines the suite
    already compiled instead of compiling them again (they are named by a hash of their
    source and checked before they are imported). Its performance models start empty."""
    path = Path(path)
    shared = Path(os.environ["HETERO_NN_CACHE"]) / "trampolines"
    shared.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True)
    (path / "trampolines").symlink_to(shared, target_is_directory=True)
    return path


def within(seconds, fn, *args):
    """``fn(*args)`` in a thread; fails (rather than hangs) when it takes longer than
    ``seconds``, re-raises what it raised, returns what it returned."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"hung: {getattr(fn, '__name__', fn)} did not return within " \
                             f"{seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def torch_sgd_losses(model, batches, lr, momentum):
    """PyTorch's side of a training cross-check: ``model`` (a ``torch.nn.Module``) trained
    by SGD with momentum under the cross-entropy on ``batches`` of NumPy ``(x, y)``; the
    losses, one per batch (torch imported here: the helpers import without it)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def central_differences(loss, x, eps):
    """``d loss() / d x`` by central differences, one element at a time: ``loss`` reads
    ``x``, which is changed in place and restored."""
    grad = np.empty_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        up = loss()
        x[i] = saved - eps
        down = loss()
        x[i] = saved
        grad[i] = (up - down) / (2 * eps)
    return grad


# -- units in the last place ---------------------------------------------------------------

#: ``(name, dtype) -> largest ULP distance`` seen by :func:`assert_ulp` calls given a name;
#: ``pytest --ulp-report FILE`` writes it out (see conftest.py, docs/codelets.md).
ULP_SEEN: dict = {}

_ORDERED = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def _ordered(values: np.ndarray) -> np.ndarray:
    """Floats as integers in the same order (adjacent floats differ by 1; -0 == +0), int64."""
    ints = values.view(_ORDERED[values.dtype]).astype(np.int64)
    sign = np.int64(np.iinfo(_ORDERED[values.dtype]).min)
    return np.where(ints < 0, sign - ints, ints)


def ulp_distance(actual, expected, dtype=None, floor=None) -> np.ndarray:
    """Distance between ``actual`` and ``expected`` in units in the last place of ``dtype``.

    Both are rounded to ``dtype`` (float32 or float64; default: ``actual``'s) first.
    With ``floor=None`` the distance is the number of representable ``dtype`` values
    between them (0: equal bits up to the sign of zero; NaN against NaN: 0; NaN against
    a number: inf). With ``floor`` (a magnitude) an element whose ``|expected|`` is
    below it is measured in ULPs of ``floor`` instead: a sum that cancels to nearly 0
    is held to the precision of its terms, not to that of its tiny result. ``"scale"``
    takes ``floor = max |expected|``: every element in ULPs of the largest magnitude.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    dtype = np.dtype(dtype or (actual.dtype if actual.dtype.kind == "f" else np.float64))
    if dtype not in _ORDERED:
        raise TypeError(f"ulp_distance: float32 or float64, not {dtype}")
    a = np.ascontiguousarray(actual, dtype=dtype)
    e = np.ascontiguousarray(expected, dtype=dtype)
    a, e = np.broadcast_arrays(a, e)
    a, e = np.ascontiguousarray(a), np.ascontiguousarray(e)
    oa, oe = _ordered(a), _ordered(e)
    high, low = np.maximum(oa, oe), np.minimum(oa, oe)
    # the difference of two ordered int64 fits in uint64 (wrap-around is exact there)
    distance = (high - low).view(np.uint64).astype(np.float64)
    if floor is not None:
        floor = float(np.max(np.abs(e), initial=0.0)) if floor == "scale" else float(floor)
        small = np.abs(e) < floor
        unit = np.spacing(dtype.type(floor)).astype(np.float64) if floor > 0 else 0.0
        if unit > 0:
            gap = np.abs(a.astype(np.float64) - e.astype(np.float64)) / unit
            distance = np.where(small, gap, distance)
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    distance = np.where(a_nan | e_nan, np.where(a_nan & e_nan, 0.0, np.inf), distance)
    return distance


def assert_ulp(actual, expected, max_ulp, *, dtype=None, floor=None, name=None) -> float:
    """Assert that no element of ``actual`` is more than ``max_ulp`` ULPs from ``expected``.

    See :func:`ulp_distance` for ``dtype`` and ``floor``. Returns the largest distance;
    with ``name`` (e.g. a codelet's name) it is also kept in :data:`ULP_SEEN` for the
    report. The message names the worst element, both values and the distance.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    distance = ulp_distance(actual, expected, dtype, floor)
    worst = float(np.max(distance, initial=0.0))
    if name is not None:
        key = (name, np.dtype(dtype or (actual.dtype if actual.dtype.kind == "f"
                                          else np.float64)).name)
        ULP_SEEN[key] = max(ULP_SEEN.get(key, 0.0), worst)
    if not worst <= max_ulp:
        index = np.unravel_index(int(np.argmax(distance)), distance.shape) if distance.ndim else ()
        a = np.broadcast_to(actual, distance.shape)[index]
        e = np.broadcast_to(expected, distance.shape)[index]
        raise AssertionError(f"{name or 'values'}: {worst:g} ULPs (> {max_ulp}) at {index}: "
                             f"{a!r} against {e!r}" + (f" (floor {floor})" if floor else ""))
    return worst


def same_bytes(a: dict, b: dict) -> None:
    """Two ``{name: array}`` states hold the same keys, dtypes and bytes."""
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


def small_run(cluster, on_step=None, epochs=2, seed=0) -> dict:
    """dahl-basic on 192 synthetic 12x12 images, batch 32, granularity 4, on ``cluster``
    (one process on ``cpu:2`` when None): the final weights."""
    import hetero_nn as hn

    data = hn.datasets.load("synthetic", "train", image_size=12, num_samples=192)
    model = hn.build_model("dahl-basic", data.input_shape, data.num_classes, seed=seed)
    with (hn.Runtime(devices="cpu:1" if cluster else "cpu:2", perfmodel=False,
                     trace=False) as rt,
          hn.Trainer(model, runtime=rt, batch_size=32, granularity=4, cluster=cluster) as t):
        t.fit(data, epochs=epochs, verbose=0, on_step=on_step)
    return model.state_dict()


def draw_window(draw, kernel, dilation, stride, pad, size):
    """A random convolution window and an input it fits, drawn with hypothesis's ``draw``:
    ``(k, stride, pad, dilation, mode, h, w)``. Each argument bounds its draws (kernel
    sides, dilations, strides, explicit paddings, image sides); half the windows have
    ``pad="same"`` at stride 1. The input fits the dilated kernel and the padding mode's
    limit (reflect: pad < size)."""
    k = (draw(st.integers(1, kernel)), draw(st.integers(1, kernel)))
    dil = (draw(st.integers(1, dilation)), draw(st.integers(1, dilation)))
    mode = draw(st.sampled_from(list(padding.MODES)))
    same = draw(st.booleans())
    strides = (1, 1) if same else (draw(st.integers(1, stride)), draw(st.integers(1, stride)))
    pads = "same" if same else (draw(st.integers(0, pad)), draw(st.integers(0, pad)))
    sides = padding.resolve_padding(pads, k, strides, dil)
    extent = [d * (kk - 1) + 1 for d, kk in zip(dil, k)]
    h = draw(st.integers(max(1, extent[0] - sides[0] - sides[1], max(sides[:2]) + 1), size))
    w = draw(st.integers(max(1, extent[1] - sides[2] - sides[3], max(sides[2:]) + 1), size))
    return k, strides, pads, dil, mode, h, w
