"""peers.svg: throughput against measured peak, one marker style per system, stash's budget
curve through its points with its knee marked. Hand-written SVG on the canvas stash's C++
plots use (planner/plots/svg_plot.h: 960 x 600, the same margins, grid and ticks), so the
figures in docs/figures/ look alike; no plotting library.

Note [The knee of stash's curve]
The knee is taken on stash's efficient points (its Pareto front: no other stash point has
as little peak and more throughput), sorted by peak: the point farthest from the straight
line between the front's two ends, both axes scaled to [0, 1] first (the "Kneedle" rule),
where giving up more memory starts to cost throughput. A point that a noisy step time
pushed below the front cannot be the knee. With fewer than three efficient points there
is no knee.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

W, H = 960.0, 600.0
L, R, T, B = 92.0, 40.0, 70.0, 78.0

# kind -> (colour, marker shape)
STYLE = {
    "keep-all": ("#222222", "square"),
    "full-ac": ("#d62728", "triangle"),
    "sac": ("#ff7f0e", "diamond"),
    "save_on_cpu": ("#2ca02c", "triangle-down"),
    "torchtune": ("#9467bd", "cross"),
    "compile": ("#8c564b", "pentagon"),
    "compile-offload": ("#e377c2", "pentagon"),
    "stash": ("#1f77b4", "circle"),
}
KIND_LABEL = {
    "keep-all": "keep-all", "full-ac": "full activation checkpointing",
    "sac": "selective checkpointing (op)", "save_on_cpu": "save_on_cpu",
    "torchtune": "torchtune OffloadActivations", "compile": "torch.compile memory budget",
    "compile-offload": "torch.compile activation offloading", "stash": "stash.torch.fit",
}


def tick_step(span: float, target: int = 6) -> float:
    """A 1-2-2.5-5 step giving at most about target ticks over span."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _fmt(v: float, step: float) -> str:
    decimals = max(0, -int(math.floor(math.log10(step) + 1e-9))) if step < 1 else 0
    if step < 1 and abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-9:
        decimals += 1
    return f"{v:.{decimals}f}"


def _range(vals: Sequence[float]) -> Tuple[float, float]:
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.1 or 1.0
    return lo - pad, hi + pad


def pareto_front(points: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The (peak, throughput) points no other point beats on both, by peak."""
    front: List[Tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def knee(points: Sequence[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    """The knee of stash's points (Note [The knee of stash's curve])."""
    front = pareto_front(points)
    at = _kneedle(front) if len(front) >= 3 else None
    return front[at] if at is not None else None


def _kneedle(points: Sequence[Tuple[float, float]]) -> Optional[int]:
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xspan, yspan = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    n = [((x - min(xs)) / xspan, (y - min(ys)) / yspan) for x, y in points]
    (x0, y0), (x1, y1) = n[0], n[-1]
    length = math.hypot(x1 - x0, y1 - y0) or 1.0
    dist = [abs((y1 - y0) * x - (x1 - x0) * y + x1 * y0 - y1 * x0) / length for x, y in n]
    best = max(range(1, len(n) - 1), key=lambda i: dist[i])
    return best if dist[best] > 1e-9 else None


def stash_curve(rows: List[Dict[str, Any]]) -> List[Tuple[float, float]]:
    """stash's budget curve: (peak GiB, tokens/s) of its rows that ran, in budget order."""
    ok = [r for r in rows if r["kind"] == "stash" and r.get("status") == "ok"
          and r.get("peak_bytes") and r.get("tokens_per_s")]
    ok.sort(key=lambda r: (r.get("stash") or {}).get("budget_bytes") or 0)
    return [(r["peak_bytes"] / float(1 << 30), r["tokens_per_s"]) for r in ok]


def _marker(shape: str, x: float, y: float, colour: str, r: float = 6.0) -> str:
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{colour}"/>'
    if shape == "square":
        return (f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" '
                f'height="{2 * r:.1f}" fill="{colour}"/>')
    if shape == "cross":
        return (f'<path d="M{x - r:.1f},{y - r:.1f}L{x + r:.1f},{y + r:.1f}M{x - r:.1f},'
                f'{y + r:.1f}L{x + r:.1f},{y - r:.1f}" stroke="{colour}" stroke-width="2.5"/>')
    corners = {"triangle": [(0, -1.2), (1.1, 0.8), (-1.1, 0.8)],
               "triangle-down": [(0, 1.2), (1.1, -0.8), (-1.1, -0.8)],
               "diamond": [(0, -1.3), (1.1, 0), (0, 1.3), (-1.1, 0)],
               "pentagon": [(math.cos(math.radians(90 + 72 * k)) * 1.15,
                             -math.sin(math.radians(90 + 72 * k)) * 1.15) for k in range(5)]}
    pts = " ".join(f"{x + dx * r:.1f},{y + dy * r:.1f}" for dx, dy in corners[shape])
    return f'<polygon points="{pts}" fill="{colour}"/>'


def peers_svg(rows: List[Dict[str, Any]], title: str, subtitle: str) -> str:
    """rows: the table's rows that ran ({kind, label, peak_bytes, tokens_per_s})."""
    gib = float(1 << 30)
    pts = [r for r in rows if r.get("status") == "ok" and r.get("peak_bytes")
           and r.get("tokens_per_s")]
    if not pts:
        raise ValueError("no row has both a measured peak and a throughput to plot")
    xs = [r["peak_bytes"] / gib for r in pts]
    ys = [r["tokens_per_s"] for r in pts]
    xlo, xhi = _range(xs)
    ylo, yhi = _range(ys)

    def px(v: float) -> float:
        return L + (v - xlo) / (xhi - xlo) * (W - L - R)

    def py(v: float) -> float:
        return (H - B) - (v - ylo) / (yhi - ylo) * (H - B - T)

    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" height="{H:.0f}" '
           f'viewBox="0 0 {W:.0f} {H:.0f}" font-family="Helvetica, Arial, sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{W / 2:.1f}" y="30" font-size="18" font-weight="bold" '
           f'text-anchor="middle">{escape(title)}</text>',
           f'<text x="{W / 2:.1f}" y="52" font-size="13" fill="#555" '
           f'text-anchor="middle">{escape(subtitle)}</text>']
    for axis, lo, hi, to_px in (("x", xlo, xhi, px), ("y", ylo, yhi, py)):
        step = tick_step(hi - lo)
        v = math.ceil(lo / step) * step
        anchor = "middle" if axis == "x" else "end"
        out.append(f'<g id="{axis}-axis" font-size="12" text-anchor="{anchor}">')
        while v <= hi + 1e-12:
            p = to_px(v)
            if axis == "x":
                out.append(f'<line x1="{p:.1f}" y1="{T:.1f}" x2="{p:.1f}" y2="{H - B:.1f}" '
                           'stroke="#e4e4e4"/>')
                out.append(f'<text x="{p:.1f}" y="{H - B + 21:.1f}">{_fmt(v, step)}</text>')
            else:
                out.append(f'<line x1="{L:.1f}" y1="{p:.1f}" x2="{W - R:.1f}" y2="{p:.1f}" '
                           'stroke="#e4e4e4"/>')
                out.append(f'<text x="{L - 10:.1f}" y="{p + 4:.1f}">{_fmt(v, step)}</text>')
            v += step
        out.append("</g>")
    out.append(f'<rect x="{L:.1f}" y="{T:.1f}" width="{W - L - R:.1f}" height="{H - T - B:.1f}" '
               'fill="none" stroke="black"/>')
    out.append(f'<text x="{(L + W - R) / 2:.1f}" y="{H - 30:.1f}" font-size="14" '
               'text-anchor="middle">measured peak (GiB)</text>')
    out.append(f'<text x="24" y="{(T + H - B) / 2:.1f}" font-size="14" text-anchor="middle" '
               f'transform="rotate(-90 24 {(T + H - B) / 2:.1f})">tokens/s</text>')

    stash_pts = stash_curve(pts)
    if len(stash_pts) >= 2:
        d = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}"
                     for i, (x, y) in enumerate(stash_pts))
        out.append(f'<path d="{d}" fill="none" stroke="{STYLE["stash"][0]}" '
                   'stroke-width="1.5" stroke-dasharray="5,3"/>')
    k = knee(stash_pts)
    if k is not None:
        x, y = k
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="11" fill="none" '
                   f'stroke="{STYLE["stash"][0]}" stroke-width="2"/>')
        anchor = "end" if px(x) > (L + W - R) / 2 else "start"
        tx = px(x) - 14 if anchor == "end" else px(x) + 14
        out.append(f'<text x="{tx:.1f}" y="{py(y) - 12:.1f}" font-size="12" '
                   f'text-anchor="{anchor}" fill="{STYLE["stash"][0]}">'
                   f'knee: {x:.2f} GiB, {y:.0f} tokens/s</text>')
    for r in pts:
        colour, shape = STYLE.get(r["kind"], ("#777777", "circle"))
        out.append(_marker(shape, px(r["peak_bytes"] / gib), py(r["tokens_per_s"]), colour)
                   + f'<title>{escape(r["label"])}</title>')

    kinds = [k for k in STYLE if any(r["kind"] == k for r in pts)]
    # The legend goes in the plot's corner that covers the fewest points.
    lw, lh = 250.0, 20.0 * len(kinds) + 8
    corners = [(W - R - lw - 6, T + 6), (L + 6, T + 6), (W - R - lw - 6, H - B - lh - 6),
               (L + 6, H - B - lh - 6)]
    marks = [(px(r["peak_bytes"] / gib), py(r["tokens_per_s"])) for r in pts]
    bx, by = min(corners, key=lambda c: sum(c[0] - 12 <= mx <= c[0] + lw + 12 and
                                            c[1] - 12 <= my <= c[1] + lh + 12
                                            for mx, my in marks))
    lx, ly = bx + 10, by + 14
    out.append(f'<rect x="{bx:.1f}" y="{by:.1f}" width="{lw:.0f}" height="{lh:.1f}" '
               'fill="white" fill-opacity="0.85" stroke="#bbb"/>')
    for i, kind in enumerate(kinds):
        colour, shape = STYLE[kind]
        y = ly + 20 * i
        out.append(_marker(shape, lx + 6, y - 4, colour, 5))
        out.append(f'<text x="{lx + 20:.1f}" y="{y:.1f}" font-size="12">'
                   f'{escape(KIND_LABEL[kind])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
