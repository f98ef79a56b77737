"""``conv_winograd.py`` at an earlier commit against the checkout's, interleaved in one process:
the forward, input-gradient and weight-gradient calls of each layer shape, one partition, one
thread, float32, thread CPU time, medians of the rounds, and whether the two give the same bits.

The earlier module is read with ``git show REV:hetero_nn/codelets/conv_winograd.py`` and
loaded beside the package (its relative imports made absolute), so both run on the same
kernels of the other modules. Ratios measured side by side survive a loaded machine better
than absolute times. The weight gradient is timed where Winograd takes it (128 channels or
more on both sides).

    python benchmarks/bench_winograd_revisions.py --rev 2165835 --partition 16 \\
        --shapes 64,128,16 128,256,8 256,256,8 256,512,4 512,512,4      # VGG-11's layers
    python benchmarks/bench_winograd_revisions.py --rev 2165835 --partition 32 \\
        --shapes 64,64,8 128,128,4                                       # ResNet-18 (tv)
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from hetero_nn.codelets import conv, conv_winograd
from hetero_nn.codelets.conv_im2col import worker_buffer

REPO = Path(__file__).resolve().parents[1]


def module_at(rev):
    """``conv_winograd`` as it was at ``rev``, loaded under another name."""
    source = subprocess.run(["git", "show", f"{rev}:hetero_nn/codelets/conv_winograd.py"],
                            cwd=REPO, check=True, capture_output=True, text=True).stdout
    source = re.sub(r"^from \.(\w+) import", r"from hetero_nn.codelets.\1 import", source,
                    flags=re.M)
    path = Path(tempfile.mkdtemp()) / f"conv_winograd_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runner(module, name, *operands):
    calls = getattr(module, name)(worker_buffer, *operands)

    def run():
        for kernel, args in calls:
            kernel(*args)
    return run


def median_ms(run, rounds):
    run()
    times = []
    for _ in range(rounds):
        t0 = time.thread_time()
        run()
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the earlier commit")
    ap.add_argument("--partition", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="+", required=True, metavar="C,O,H",
                    help="3x3, stride-1, padding-1 layers: input and output channels, image side")
    args = ap.parse_args(argv)
    before, rng, n = module_at(args.rev), np.random.default_rng(0), args.partition
    print(f"{args.rev} -> checkout; partition of {n} images, one thread, float32, ms (median "
          f"of {args.rounds})")
    with threadpool_limits(1):
        for shape in args.shapes:
            c, o, h = map(int, shape.split(","))
            x = rng.standard_normal((n, c, h, h), dtype=np.float32)
            w = rng.standard_normal((o, c, 3, 3), dtype=np.float32)
            b = rng.standard_normal(o, dtype=np.float32)
            geo = conv.conv2d_geometry(x.shape, w.shape, padding=1)
            dy = rng.standard_normal((n, o, geo.out_h, geo.out_w), dtype=np.float32)
            passes = {"fwd": ("fwd_calls", lambda: (x, w, b, np.empty_like(dy))),
                      "bwd_input": ("bwd_input_calls", lambda: (dy, w, np.empty_like(x)))}
            if min(c, o) >= conv_winograd.WEIGHT_MIN_CHANNELS:
                passes["bwd_weight"] = ("bwd_params_calls",
                                        lambda: (x, dy, np.zeros_like(w), np.zeros_like(b)))
            cells = []
            for label, (name, make) in passes.items():
                ops = [make(), make()]
                runs = [runner(m, name, *o_, geo) for m, o_ in zip((before, conv_winograd), ops)]
                t = [median_ms(r, args.rounds) for r in runs]
                same = all(np.array_equal(a, b_) for a, b_ in zip(*ops))
                cells.append(f"{label} {t[0]:6.2f} -> {t[1]:6.2f} ({t[0] / t[1]:4.2f}x"
                             f"{'' if same else ', bits differ'})")
            print(f"{c}->{o} {h}x{h}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
