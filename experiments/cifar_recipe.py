"""The CIFAR-10 recipe, hetero_nn next to PyTorch: the same network, data, order,
augmentation and schedule in one run.

hetero_nn trains through the real CLI, as the README's recipe::

    hetero-nn train --dataset cifar10 --model MODEL --epochs E --batch-size B \\
        --optimizer sgd --lr LR --momentum 0.9 --nesterov --weight-decay 5e-4 \\
        --schedule onecycle --max-lr LR --label-smoothing EPS --augment --out OUT

and PyTorch trains the twin of the same built-in model (``hn.to_torch``: ``torch.nn``
layers holding a copy of the same initial weights) in this process, in float32, on the very same
batches: the dataset's normalised images, in ``epoch_order(seed, epoch)``, augmented
by the same :mod:`hetero_nn.transforms` draws (so both see identical pixels), with
``torch.optim.SGD(nesterov=True)``, ``OneCycleLR`` and ``cross_entropy(label_smoothing)``.
Both are evaluated on the test split after every epoch (PyTorch in ``eval()`` mode).

The script writes one JSON document -- git commit, versions, machine, options, both
runs' per-epoch test accuracy and seconds, the accuracy at the ``--report`` epochs
and the wall times -- to ``experiments/results/cifar-recipe-<UTC time>.json`` and
``cifar-recipe-latest.json``.

Examples::

    python experiments/cifar_recipe.py --data-dir ../shared/datasets --model resnet-small \\
        --epochs 30 --report 10 30
    python experiments/cifar_recipe.py --data-dir ../shared/datasets --model cifar-small \\
        --limit 256 --epochs 1 --batch-size 32         # a smoke test: seconds
    python experiments/cifar_recipe.py --data-dir ../shared/datasets --model resnet18 \\
        --epochs 5 --batch-size 64 --lr 0.05 --report 1 3 5 --devices cpu:2
                                  # ResNet-18 (CIFAR layout): issue 28's accuracy goal
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def hetero_nn_run(args, out) -> dict:
    """Train through ``hetero-nn train``; return its per-epoch figures and wall time."""
    cmd = [sys.executable, "-m", "hetero_nn", "train", "--dataset", "cifar10",
           "--model", args.model, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--seed", str(args.seed),
           "--optimizer", "sgd", "--lr", str(args.lr), "--momentum", "0.9", "--nesterov",
           "--weight-decay", str(args.weight_decay), "--schedule", "onecycle",
           "--max-lr", str(args.lr), "--augment", "--out", str(out), "-q"]
    if args.label_smoothing:
        cmd += ["--label-smoothing", str(args.label_smoothing)]
    for option in ("data_dir", "limit", "devices", "granularity"):
        value = getattr(args, option)
        if value is not None:
            cmd += [f"--{option.replace('_', '-')}", str(value)]
    print("== hetero_nn:", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    result = {"command": cmd[1:], "returncode": proc.returncode, "wall_seconds": wall}
    metrics = out / "metrics.json"
    if proc.returncode != 0 or not metrics.is_file():
        result["stderr_tail"] = proc.stderr[-2000:]
        print(proc.stderr[-2000:], file=sys.stderr)
        return result
    doc = json.loads(metrics.read_text())
    result.update(config=doc["config"], devices=doc["devices"], granularity=doc["granularity"],
                  epochs=[{k: r[k] for k in ("epoch", "train_loss", "train_accuracy",
                                             "test_loss", "test_accuracy", "seconds")}
                          for r in doc["epochs"]],
                  train_seconds=doc["train_seconds"])
    return result


def torch_run(args) -> dict:
    """The PyTorch twin trained on the same batches; per-epoch figures and wall time."""
    import torch

    import hetero_nn as hn

    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    train = hn.datasets.load("cifar10", "train", data_dir=args.data_dir, limit=args.limit)
    test = hn.datasets.load("cifar10", "test", data_dir=args.data_dir, limit=args.limit)
    model = hn.build_model(args.model, train.input_shape, train.num_classes, seed=args.seed)
    net = hn.to_torch(model).float().train()  # the same layers and initial weights
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                          weight_decay=args.weight_decay)
    steps = -(-len(train) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr,
                                                total_steps=args.epochs * steps)
    augment = hn.transforms.standard_augmentation(train)
    epochs = []
    for e in range(args.epochs):
        net.train()
        order = train.epoch_order(args.seed, e)
        t_epoch, loss_sum, correct = time.perf_counter(), 0.0, 0
        for b in range(steps):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train.batch(idx)
            augment(x, idx, seed=args.seed, epoch=e)
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            opt.zero_grad()
            out = net(x)
            loss = torch.nn.functional.cross_entropy(out, y,
                                                     label_smoothing=args.label_smoothing)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
        seconds = time.perf_counter() - t_epoch
        net.eval()
        test_correct, test_loss = 0, 0.0
        with torch.no_grad():
            for start in range(0, len(test), 1000):
                x, y = test.batch(np.arange(start, min(start + 1000, len(test))))
                out = net(torch.from_numpy(x))
                test_loss += torch.nn.functional.cross_entropy(
                    out, torch.from_numpy(y), reduction="sum").item()
                test_correct += int((out.argmax(1) == torch.from_numpy(y)).sum())
        epochs.append({"epoch": e + 1, "train_loss": loss_sum / len(train),
                       "train_accuracy": correct / len(train), "test_loss": test_loss / len(test),
                       "test_accuracy": test_correct / len(test), "seconds": seconds})
        print(f"== torch epoch {e + 1}: test accuracy {epochs[-1]['test_accuracy']:.2%}, "
              f"{seconds:.1f} s", flush=True)
    return {"torch_threads": torch.get_num_threads(), "epochs": epochs,
            "train_seconds": sum(r["seconds"] for r in epochs),
            "wall_seconds": time.perf_counter() - t0}


def _at(run, epoch):
    for r in run.get("epochs", []):
        if r["epoch"] == epoch:
            return r["test_accuracy"]
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder holding cifar-10/")
    parser.add_argument("--model", default="resnet-small", help="a built-in model name")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--report", type=int, nargs="*", default=[10, 30],
                        help="epochs whose test accuracy the summary shows")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1, help="OneCycle's max_lr")
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, help="only the first N images of each split")
    parser.add_argument("--devices", help="hetero-nn's workers (default: its own)")
    parser.add_argument("--granularity")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--out", help="hetero-nn's output folder (default: a temporary one)")
    parser.add_argument("--results", default=str(HERE / "results"))
    args = parser.parse_args(argv)

    from hetero_nn.cli.run_folder import environment

    out = Path(args.out or tempfile.mkdtemp(prefix="hetero_nn-cifar-recipe-"))
    started, load = datetime.now(timezone.utc), os.getloadavg()
    ours = hetero_nn_run(args, out / "hetero_nn")
    theirs = None if args.skip_torch else torch_run(args)
    runs = {"hetero_nn": ours, "torch": theirs}
    report = {name: {str(e): _at(run, e) for e in args.report} for name, run in runs.items()
              if run is not None}
    document = {"experiment": "cifar-recipe", "started_utc": started.isoformat(timespec="seconds"),
                **environment(), "options": vars(args), "load_average": load,
                "load_average_end": os.getloadavg(), "runs": runs,
                "test_accuracy_at": report}
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"cifar-recipe-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    shutil.copyfile(path, results / "cifar-recipe-latest.json")
    print(f"\n{'':10s} " + " ".join(f"{'acc@' + str(e):>9s}" for e in args.report)
          + f" {'train s':>8s} {'wall s':>8s}")
    for name, run in runs.items():
        if run is None:
            continue
        accs = [report[name][str(e)] for e in args.report]
        print(f"{name:10s} " + " ".join(f"{(f'{a:.2%}' if a is not None else '-'):>9s}"
                                        for a in accs)
              + f" {run.get('train_seconds', 0):>8.1f} {run['wall_seconds']:>8.1f}")
    print(f"wrote {path}")
    return 0 if ours.get("returncode") == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
