"""Which shrinks of a ShuffleNet-v2 stage keep its function exactly, and can groups express them?

    python benchmarks/shuffle_exact.py            # the toy brute force, then the real stages

A stage of ShuffleNet v2 has ``n`` blocks of width ``c`` per branch. Block 1 concatenates two
branches ``A``, ``B``; block ``k > 1`` passes the first half of the previous output through
(``x1``) and replaces the second half by a branch ``C_k``; every block ends with a channel
shuffle (``view(b, 2, c, h, w)``, ``transpose(1, 2)``, ``view(b, 2c, h, w)``), so its output
interleaves its two inputs, and the next block's ``chunk(2)`` cuts it in halves.

A resize keeps ordered entries of every producer (``A``, ``B``, ``C_k``); the resized model
runs the same code at width ``c'``. It is exact (its output equals the original's with the
dropped channels zeroed) exactly when, at every ``chunk``, each half of the resized tensor
holds channels of the same half of the original tensor. Label each channel by its *path*
(the half it lands in at every chunk it meets): then a resize is exact iff it keeps, from the
channels of each path ``P`` of each producer, exactly ``f_P(c')`` of them in their original
order of paths, where ``f_P(w)`` counts the channels of path ``P`` in a stage of width ``w``.

Part 1 enumerates every selection of small toys and checks that claim (both ways, and each
exact selection numerically). Part 2 computes the paths of the real stages and asks what a
*group* model can express: fxsym's groups keep whole units with equal unit counts within a
same-size class, so every path would have to keep ``r_P + k * u_P`` channels for a shared
``k``. It prints, per stage, the most widths such an affine family through the original width
has (``widths``; 2 means "keep all, or one fixed smaller width").
"""

from __future__ import annotations

import itertools
import math

import torch

Label = tuple[str, int]


def _shuffle(chs: list[Label]) -> list[Label]:
    half = len(chs) // 2
    return [chs[(p % 2) * half + p // 2] for p in range(len(chs))]


def _names(blocks: int) -> list[str]:
    return ["A", "B"] + [f"C{k}" for k in range(2, blocks + 1)]


def run(kept: dict[str, list[Label]], blocks: int) -> tuple[list[tuple[list[Label], ...]],
                                                            list[Label]]:
    """The (x1, x2) halves at every chunk and the stage output, as channel labels."""
    s = _shuffle(kept["A"] + kept["B"])
    halves = []
    for k in range(2, blocks + 1):
        x1, x2 = s[: len(s) // 2], s[len(s) // 2:]
        halves.append((x1, x2))
        s = _shuffle(x1 + kept[f"C{k}"])
    return halves, s


def paths(width: int, blocks: int) -> dict[tuple[str, tuple[int, ...]], int]:
    """``f_P(width)``: how many channels of each producer follow each path."""
    full = {n: [(n, i) for i in range(width)] for n in _names(blocks)}
    halves, _ = run(full, blocks)
    path: dict[Label, tuple[int, ...]] = {lab: () for n in full for lab in full[n]}
    for x1, x2 in halves:
        for side, part in enumerate((x1, x2)):
            for lab in part:
                path[lab] += (side,)
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    for lab, p in path.items():
        out[(lab[0], p)] = out.get((lab[0], p), 0) + 1
    return out


def is_exact(c: int, kept: dict[str, list[Label]], blocks: int) -> bool:
    full = {n: [(n, i) for i in range(c)] for n in _names(blocks)}
    original, _ = run(full, blocks)
    resized, _ = run(kept, blocks)
    return all(set(r1) <= set(o1) and set(r2) <= set(o2)
               for (o1, o2), (r1, r2) in zip(original, resized, strict=True))


def numerically_exact(c: int, kept: dict[str, list[Label]], blocks: int, seed: int = 0) -> bool:
    """Build the toy (1x1 convs as matrices, tanh) with random weights, slice it along the
    label maps and compare with the original whose dropped rows are zero."""
    g = torch.Generator().manual_seed(seed)
    names = _names(blocks)
    weights = {n: torch.randn(c, c if n.startswith("C") else 3, generator=g) for n in names}
    head = torch.randn(5, 2 * c, generator=g)
    x = torch.randn(4, 3, generator=g)

    def forward(w: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        t = torch.cat([torch.tanh(x @ w["A"].T), torch.tanh(x @ w["B"].T)], 1)
        t = t.view(-1, 2, t.shape[1] // 2).transpose(1, 2).reshape(t.shape[0], -1)
        for k in range(2, blocks + 1):
            x1, x2 = t.chunk(2, 1)
            t = torch.cat([x1, torch.tanh(x2 @ w[f"C{k}"].T)], 1)
            t = t.view(-1, 2, t.shape[1] // 2).transpose(1, 2).reshape(t.shape[0], -1)
        return t @ h.T

    zeroed = {}
    for n in names:
        w = weights[n].clone()
        w[[i for i in range(c) if (n, i) not in kept[n]]] = 0
        zeroed[n] = w
    full = {n: [(n, i) for i in range(c)] for n in names}
    original, out_o = run(full, blocks)
    resized, out_r = run(kept, blocks)
    small = {n: weights[n][[i for _, i in kept[n]]] for n in ("A", "B")}
    for k, ((_, o2), (_, r2)) in enumerate(zip(original, resized, strict=True), start=2):
        at = {lab: j for j, lab in enumerate(o2)}
        small[f"C{k}"] = weights[f"C{k}"][[i for _, i in kept[f"C{k}"]]][
            :, [at[lab] for lab in r2]]
    at = {lab: j for j, lab in enumerate(out_o)}
    return torch.allclose(forward(small, head[:, [at[lab] for lab in out_r]]),
                          forward(zeroed, head), atol=1e-5)


def brute_force(c: int, width: int, blocks: int) -> tuple[int, int]:
    """(exact selections, all selections) of ``width`` ordered channels per producer; asserts
    the path criterion (as many as it counts) and the numeric check on every exact one."""
    names = _names(blocks)
    exact = total = 0
    for combo in itertools.product(itertools.permutations(range(c), width), repeat=len(names)):
        kept = {n: [(n, i) for i in s] for n, s in zip(names, combo, strict=True)}
        total += 1
        if is_exact(c, kept, blocks):
            exact += 1
            assert numerically_exact(c, kept, blocks), (c, width, combo)
    full, small = paths(c, blocks), paths(width, blocks)
    predicted = 0 if set(small) - set(full) else 1
    for key, n in full.items():
        predicted *= math.perm(n, small.get(key, 0)) if small.get(key, 0) <= n else 0
    assert exact == predicted, (c, width, exact, predicted)
    return exact, total


def affine_widths(c: int, blocks: int) -> tuple[int, int]:
    """The most widths ``c, c - d, ..., c - (U-1)*d`` along which every path keeps
    ``r_P + k * u_P`` channels (``k = U`` at width ``c``, ``r_P >= 0``): ``(U, d)``."""
    base = paths(c, blocks)
    best = (1, 0)
    for d in range(1, c):
        step: dict[tuple[str, tuple[int, ...]], int] | None = None
        prev, u = base, 1
        while c - u * d >= 1:
            cur = paths(c - u * d, blocks)
            if set(cur) - set(base):
                break
            s = {key: prev.get(key, 0) - cur.get(key, 0) for key in base}
            if min(s.values()) < 0 or (step is not None and s != step):
                break
            step, prev, u = s, cur, u + 1
        while step is not None and u >= 2 and any(base[k] - u * step[k] < 0 for k in base):
            u -= 1
        best = max(best, (u, d))
    return best


#: (blocks, branch width, resized width) of the toys enumerated
TOYS = ((2, 2, 1), (2, 3, 1), (2, 3, 2), (2, 4, 1), (2, 4, 2), (2, 4, 3),
        (3, 2, 1), (3, 3, 1), (3, 3, 2), (3, 4, 1), (3, 4, 2), (4, 3, 2))


def main() -> None:
    print("toy stages: exact selections / all ordered selections")
    for blocks, c, w in TOYS:
        exact, total = brute_force(c, w, blocks)
        print(f"  blocks={blocks} c={c} c'={w}: {exact}/{total} exact "
              "(= the path criterion's count, each checked numerically)")
    print("real stages (per branch width c, blocks n): paths, longest affine family of widths")
    for model, stages in (("x0_5", ((24, 4), (48, 8), (96, 4))),
                          ("x1_0", ((58, 4), (116, 8), (232, 4)))):
        for c, n in stages:
            u, d = affine_widths(c, n)
            print(f"  shufflenet_v2_{model} c={c} n={n}: {len(paths(c, n))} paths; "
                  f"widths={u} (step {d})")


if __name__ == "__main__":
    main()
