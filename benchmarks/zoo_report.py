"""Per torchvision classification model: groups, coverage, the three oracles, analyze time.

    python benchmarks/zoo_report.py [--models resnet50,vit_b_16]

Coverage is :func:`fxsym.oracles.coverage`: the share of producing modules (an OUTGOING
symbol such as a Conv's or Linear's, or a parameter used as the weight of a functional
linear/conv in a module traced into) whose output belongs to a searchable group; the
classifier head, which feeds the model output, always counts against it. The value
oracle's column reads ``checked/unchecked``: groups compared by value, and groups not
checked by value (their dim meets a normalisation or another op that mixes its entries).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import input_size, table, track, zoo_names

import fxsym
from fxsym.oracles import check_permutation, check_shrink, check_values, coverage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", help="comma-separated torchvision names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    import torchvision

    fxsym.load_plugins()
    names = args.models.split(",") if args.models else zoo_names()
    rows = []
    for name in track(names, description="zoo report"):
        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None).eval()
        size = input_size(name)
        x = (torch.randn(1, 3, size, size),)
        start = time.perf_counter()
        sm = fxsym.analyze(model, example_inputs=x)
        elapsed = time.perf_counter() - start
        perm, shrink = check_permutation(model, sm, x), check_shrink(model, sm, x)
        values = check_values(model, sm, x)
        rows.append([name, len(sm.groups()), f"{coverage(sm):.2f}",
                     perm.status if perm.status != "failed" else str(perm)[:60],
                     shrink.status if shrink.status != "failed" else str(shrink)[:60],
                     f"{values.status} {values.checked}/{len(values.unchecked)}"
                     if values.status != "failed" else str(values)[:60],
                     len(sm.trace_report.fallbacks), f"{elapsed:.2f}"])
        del model, sm
    print(table(rows, ["model", "groups", "coverage", "permutation", "shrink", "values",
                       "fallbacks",
                       "analyze s"]))


if __name__ == "__main__":
    main()
