"""``hetero-nn evaluate``: loss and accuracy of a checkpoint on a dataset.

The model and its dtype come from the checkpoint, and so do the dataset, the data
directory, the batch size, the granularity and the channel normalisation of the run
that wrote it, unless the options say otherwise::

    hetero-nn evaluate --checkpoint runs/c10/checkpoint-final.npz [--split train] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

from ..errors import ConfigError, HeteroNNError
from ..snn_models import intensities, spiking_loss
from . import options
from .connect import dask_client, make_runtime
from .options import dataset_error
from .run_folder import Interrupts
from ..datasets import DATASETS, load
from ..scheduler.policies.policies import POLICIES
from ..training import Trainer
from ..training.checkpoint import read_checkpoint, rebuild_model
from ..transforms import Normalize, NormalizedData


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``evaluate`` to the subcommands ``sub``."""
    ev = sub.add_parser("evaluate", help="loss and accuracy of a checkpoint on a dataset",
                        description="Evaluate a checkpoint; the model and dtype come from it.")
    ev.add_argument("--checkpoint", required=True, metavar="FILE")
    ev.add_argument("--dataset", choices=DATASETS, help="default: the checkpoint's")
    ev.add_argument("--data-dir", help="default: the one the checkpoint was trained from")
    ev.add_argument("--split", choices=("train", "test"), default="test")
    ev.add_argument("--limit", type=options.positive_int, metavar="N")
    ev.add_argument("--batch-size", type=options.positive_int, help="default: the checkpoint's")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    options.add_runtime_options(ev, POLICIES)
    return ev


def command(args) -> int:
    """``hetero-nn evaluate``: the model and dtype come from the checkpoint."""
    ckpt = read_checkpoint(args.checkpoint)
    model = rebuild_model(ckpt)
    run = ckpt.config.get("run", {})
    name = args.dataset or run.get("dataset")
    if name is None:
        raise ConfigError(f"--dataset: {args.checkpoint} does not say which dataset it was "
                          "trained on; give --dataset")
    try:
        data = load(name, args.split, data_dir=args.data_dir or run.get("data_dir"),
                    limit=args.limit)
    except HeteroNNError as exc:
        raise dataset_error(name, exc) from None
    loss = spiking_loss(ckpt.config.get("model", {}).get("name"))
    if loss is not None:  # a spiking model reads intensities in [0, 1]
        intensities(data)
    stats = ckpt.config.get("normalize")
    if stats:  # the run standardised its channels (--normalize): evaluate the same way
        data = NormalizedData(data, Normalize(stats["mean"], stats["std"]))
    if tuple(data.input_shape) != tuple(model.input_shape):
        raise ConfigError(f"--dataset {name}: samples of shape {data.input_shape}, but the "
                          f"checkpoint's model expects {tuple(model.input_shape)}")
    classes = model.output_shape[-1]
    if data.num_classes != classes:
        raise ConfigError(f"--dataset {name}: {data.num_classes} classes, the checkpoint's model "
                          f"has {classes}")
    batch_size = args.batch_size or ckpt.config.get("batch_size", 64)
    g = ckpt.config.get("granularity") or 1
    with contextlib.ExitStack() as stack:
        client = dask_client(args.executor, args.devices, stack, args.connect_timeout)
        rt = make_runtime(args.devices, args.policy, client or args.executor,
                          deterministic=run.get("deterministic", True))
        stack.callback(rt.close)
        trainer = Trainer(model, loss, runtime=rt, batch_size=batch_size,
                          granularity=min(g, batch_size))
        t0 = time.perf_counter()
        with Interrupts(defer=False):
            loss, accuracy = trainer.evaluate(data)
        seconds = time.perf_counter() - t0
    result = {"checkpoint": str(args.checkpoint), "dataset": name, "split": args.split,
              "samples": len(data), "loss": loss, "accuracy": accuracy, "seconds": seconds,
              "model": ckpt.config.get("model", {}).get("name", type(model).__name__),
              "dtype": model.dtype.name}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{name} {args.split}: loss {loss:.4f}, accuracy {accuracy:.2%} on {len(data)} "
              f"samples ({result['model']}, {result['dtype']}, {seconds:.1f} s)")
    return 0
