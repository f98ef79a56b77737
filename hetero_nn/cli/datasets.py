"""``hetero-nn datasets``: which datasets are in the data directory, and downloads.

::

    hetero-nn datasets list [--verify]
    hetero-nn datasets download mnist [--mirror URL]

``hetero-nn datasets`` alone prints its usage (exit 0).
"""

from __future__ import annotations

import argparse
import sys

from ..tables import format_table
from ..datasets import DATASETS, describe, download, resolve_data_dir
from ..training.progress import progress_bar


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``datasets`` and its actions to the subcommands ``sub``."""
    ds = sub.add_parser("datasets", help="list or download datasets")
    ds.set_defaults(datasets_usage=ds.format_help)  # ``hetero-nn datasets`` alone prints it
    ds_sub = ds.add_subparsers(dest="action", metavar="ACTION")
    ls = ds_sub.add_parser("list", help="which datasets are in the data directory (file "
                                        "sizes checked)")
    ls.add_argument("--data-dir")
    ls.add_argument("--verify", action="store_true",
                    help="also check published MD5s and read every file whole")
    dl = ds_sub.add_parser("download", help="download a dataset (checksums verified)")
    dl.add_argument("name", choices=[d for d in DATASETS if d != "synthetic"])
    dl.add_argument("--data-dir")
    dl.add_argument("--force", action="store_true", help="download again files that are there")
    dl.add_argument("--mirror", action="append", metavar="URL",
                    help="base URL to use instead of the official ones (repeatable, tried in "
                         "order; file:// works)")
    return ds


def command(args) -> int:
    """``hetero-nn datasets list|download``."""
    if args.action is None:
        print(args.datasets_usage(), end="")
        return 0
    if args.action == "list":
        print(f"data directory: {resolve_data_dir(args.data_dir)}")
        infos = describe(args.data_dir, verify=args.verify)
        rows = []
        for info in infos:
            samples = info.samples or {}
            rows.append((info.name, "yes" if info.present else "damaged" if info.problem else "no",
                         str(samples.get("train", "-")), str(samples.get("test", "-")),
                         "generated" if info.name == "synthetic" else str(len(info.files))))
        print(format_table(("dataset", "present", "train", "test", "files"), rows))
        for info in infos:
            if info.problem:
                print(f"{info.name}: {info.problem}")
        return 1 if args.verify and any(info.problem for info in infos) else 0
    bars = {}

    def progress(url, done, total):
        bar = bars.get(url)
        if bar is None:
            bar = bars[url] = progress_bar(total, 0, url.rsplit("/", 1)[-1], False, unit="B",
                                           unit_scale=True)
        bar.update(done - bar.n)

    try:  # bars only on a terminal
        directory = download(args.name, data_dir=args.data_dir, force=args.force,
                             mirrors=args.mirror,
                             progress=progress if sys.stderr.isatty() else None)
    finally:
        for bar in bars.values():
            bar.close()
    print(f"{args.name}: ready in {directory}")
    return 0
