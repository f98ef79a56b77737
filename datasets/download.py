#!/usr/bin/env python3
"""Download MNIST, Fashion-MNIST and CIFAR-10 (binary version), checking their MD5s.

A thin front end to :func:`hetero_nn.datasets.download`, which does the work (mirrors,
MD5 checks, temporary names renamed once verified, CIFAR-10 extraction). The default
target is the folder training reads by default (``$HETERO_NN_DATA`` when set, else
``$HETERO_NN_CACHE/data``, i.e. ``~/.cache/hetero_nn/data``); ``--data-dir datasets/data``
keeps the data beside this script (git-ignored).

    python datasets/download.py mnist --data-dir DIR
    python datasets/download.py all
    python datasets/download.py cifar10 --mirror file:///path/to/local/copy/
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    from hetero_nn import datasets
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, str(HERE.parent))
    from hetero_nn import datasets

DOWNLOADABLE = tuple(datasets.SOURCES)


def _progress():
    """A progress printer for stderr: one line per file, updated in place."""
    last = {}

    def report(url, done, total):
        step = done >> 22   # every 4 MiB
        if last.get(url) == step and done != total:
            return
        last[url] = step
        size = f"/{total / 2**20:.1f}" if total else ""
        end = "\n" if total and done >= total else "\r"
        print(f"  {url}: {done / 2**20:.1f}{size} MiB", end=end, file=sys.stderr, flush=True)

    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", choices=DOWNLOADABLE + ("all",),
                        help="datasets to fetch")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help=f"target folder (default: {datasets.resolve_data_dir()}, the folder "
                             "training reads by default)")
    parser.add_argument("--force", action="store_true",
                        help="download again even files that are present and verify")
    parser.add_argument("--mirror", action="append", default=None, metavar="URL",
                        help="base URL to use instead of the official ones (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    data_dir = datasets.resolve_data_dir(args.data_dir)
    names = DOWNLOADABLE if "all" in args.names else tuple(dict.fromkeys(args.names))
    for name in names:
        print(f"{name}:", file=sys.stderr)
        try:
            folder = datasets.download(name, data_dir, force=args.force, mirrors=args.mirror,
                                       progress=None if args.quiet else _progress())
        except datasets.DownloadError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"  ok: {folder}", file=sys.stderr)
    if args.data_dir is not None:
        print(f"Point training at it with --data-dir {data_dir} or "
              f"{datasets.DATA_ENV}={data_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
