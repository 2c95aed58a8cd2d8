"""``sfnpu compare``: the share of identical values of two .npy/.npz files."""

import numpy as np

from .common import CliError, console

NAME = "compare"
HELP = "share of identical values of two .npy/.npz files"


def add_arguments(parser):
    parser.add_argument("a")
    parser.add_argument("b")


def _load(path):
    data = np.load(path)
    return {"": data} if isinstance(data, np.ndarray) else {k: data[k] for k in data.files}


def run(args) -> int:
    a, b = _load(args.a), _load(args.b)
    if a.keys() != b.keys():
        raise CliError(f"different outputs: {sorted(a)} vs {sorted(b)}")
    worst = 0
    for name in a:
        if a[name].shape != b[name].shape:
            raise CliError(f"{name or 'output'}: shapes {a[name].shape} and {b[name].shape}")
        same = float((a[name] == b[name]).mean())
        diff = float(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)).max())
        console.print(f"{name or 'output'}: {same:.4%} identical, largest difference {diff:g}")
        worst = max(worst, diff)
    return 0 if worst == 0 else 1
