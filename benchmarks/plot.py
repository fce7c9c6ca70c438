"""The picture: ssd_forward's median GPU time against seqlen, and on the spec's anchor rows.

    python -m benchmarks.plot BENCH.json -o plot.png

Reads pytest-benchmark JSON written by tests/test_benchmarks.py; draws, from the ssd_forward
benchmarks, the seqlen sweep (left: one line per implementation and dtype) and the anchor rows
(right: one marker series per implementation and dtype), when present. The PNG is drawn on a NumPy
raster and encoded with zlib (no plotting dependency); text uses a 3x5 pixel font, upper case.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import zlib

import numpy as np

from benchmarks.configs import ANCHORS, SWEEP_TEXT

WIDTH, HEIGHT = 1000, 460
SCALE = 2  # font pixels per glyph pixel
WHITE, BLACK, GRAY = (255, 255, 255), (0, 0, 0), (200, 200, 200)
COLORS = {"cutile": (31, 119, 180), "cutile_nocheck": (120, 170, 220), "mamba_ssm": (255, 127, 14),
          "torch": (44, 160, 44)}
OTHER_COLOR = (127, 127, 127)

# 3x5 glyphs: five rows, three bits each (4 = left pixel, 1 = right pixel).
FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 3, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 2, 2),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), "A": (2, 5, 7, 5, 5), "B": (6, 5, 6, 5, 6),
    "C": (3, 4, 4, 4, 3), "D": (6, 5, 5, 5, 6), "E": (7, 4, 6, 4, 7), "F": (7, 4, 6, 4, 4),
    "G": (3, 4, 5, 5, 3), "H": (5, 5, 7, 5, 5), "I": (7, 2, 2, 2, 7), "J": (1, 1, 1, 5, 2),
    "K": (5, 5, 6, 5, 5), "L": (4, 4, 4, 4, 7), "M": (5, 7, 7, 5, 5), "N": (6, 5, 5, 5, 5),
    "O": (2, 5, 5, 5, 2), "P": (6, 5, 6, 4, 4), "Q": (2, 5, 5, 7, 3), "R": (6, 5, 6, 5, 5),
    "S": (3, 4, 2, 1, 6), "T": (7, 2, 2, 2, 2), "U": (5, 5, 5, 5, 7), "V": (5, 5, 5, 5, 2),
    "W": (5, 5, 7, 7, 5), "X": (5, 5, 2, 5, 5), "Y": (5, 5, 2, 2, 2), "Z": (7, 1, 2, 4, 7),
    " ": (0, 0, 0, 0, 0), ".": (0, 0, 0, 0, 2), ",": (0, 0, 0, 2, 4), "-": (0, 0, 7, 0, 0),
    "_": (0, 0, 0, 0, 7), "(": (1, 2, 2, 2, 1), ")": (4, 2, 2, 2, 4), "/": (1, 1, 2, 4, 4),
    ":": (0, 2, 0, 2, 0), "%": (5, 1, 2, 4, 5), "=": (0, 7, 0, 7, 0), "+": (0, 2, 7, 2, 0),
}


class Canvas:
    """An RGB raster with the few drawing operations a line chart needs."""

    def __init__(self, width: int, height: int):
        self.pixels = np.full((height, width, 3), 255, dtype=np.uint8)

    def rect(self, x0, y0, x1, y1, color):
        """Fill [x0, x1] x [y0, y1] (inclusive, clipped)."""
        h, w, _ = self.pixels.shape
        x0, x1 = max(int(round(min(x0, x1))), 0), min(int(round(max(x0, x1))), w - 1)
        y0, y1 = max(int(round(min(y0, y1))), 0), min(int(round(max(y0, y1))), h - 1)
        if x0 <= x1 and y0 <= y1:
            self.pixels[y0:y1 + 1, x0:x1 + 1] = color

    def line(self, x0, y0, x1, y1, color, width=2):
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for t in np.linspace(0.0, 1.0, steps + 1):
            x, y = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
            self.rect(x, y, x + width - 1, y + width - 1, color)

    def text(self, x, y, s: str, color=BLACK):
        """Draw `s` (upper-cased; unknown characters as blanks) with its top-left at (x, y)."""
        for ch in s.upper():
            for row, bits in enumerate(FONT.get(ch, FONT[" "])):
                for col in range(3):
                    if bits & (4 >> col):
                        self.rect(x + col * SCALE, y + row * SCALE,
                                  x + (col + 1) * SCALE - 1, y + (row + 1) * SCALE - 1, color)
            x += 4 * SCALE

    def png(self) -> bytes:
        h, w, _ = self.pixels.shape
        raw = np.concatenate([np.zeros((h, 1), np.uint8), self.pixels.reshape(h, w * 3)], axis=1)

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw.tobytes(), 9)) + chunk(b"IEND", b""))


def text_width(s: str) -> int:
    return 4 * SCALE * len(s)


def log_ticks(lo: float, hi: float) -> tuple[float, float, list[float]]:
    """(axis bottom, axis top, ticks) of a log axis: whole decades around [lo, hi], ticks at
    1, 2, 5 x 10^k."""
    bottom, top = 10.0 ** math.floor(math.log10(lo)), 10.0 ** math.ceil(math.log10(hi))
    if top == bottom:
        top *= 10.0
    ticks = [m * 10.0 ** k for k in range(round(math.log10(bottom)), round(math.log10(top)) + 1)
             for m in (1, 2, 5)]
    return bottom, top, [t for t in ticks if bottom <= t <= top]


def series(benchmarks: list[dict], kind: str) -> dict[str, list[tuple[int, float, str]]]:
    """{label: [(x, median ms, x label)]} of the ssd_forward benchmarks of `kind` ("sweep" or
    "anchor")."""
    out: dict[str, list[tuple[int, float, str]]] = {}
    for b in benchmarks:
        info = b.get("extra_info", {})
        if info.get("op") != "ssd_forward" or info.get("series") != kind:
            continue
        if kind == "sweep":
            x = int(info["config"][1])
            x_label = f"{x // 1024}K" if x % 1024 == 0 else str(x)
        else:
            x = int(info["anchor"])
            x_label = f"ROW {x}"
        label = f"{info['impl']} {info['dtype']}"
        out.setdefault(label, []).append((x, b["stats"]["median"] * 1e3, x_label))
    return {k: sorted(v) for k, v in sorted(out.items())}


def panel(canvas: Canvas, box, title: str, data: dict, connect: bool):
    """One chart in `box` = (left, top, right, bottom): categorical x, logarithmic y."""
    left, top, right, bottom = box
    canvas.text(left, top - 30, title)
    xs = sorted({(x, lab) for pts in data.values() for x, _, lab in pts})
    if not xs:
        canvas.text(left + 20, (top + bottom) // 2, "NO DATA", OTHER_COLOR)
        return
    times = [ms for pts in data.values() for _, ms, _ in pts]
    y_lo, y_hi, ticks = log_ticks(min(times), max(times))

    def y_of(ms):
        return bottom - (bottom - top) * math.log(ms / y_lo) / math.log(y_hi / y_lo)

    for v in ticks:
        y = y_of(v)
        canvas.line(left, y, right, y, GRAY, width=1)
        label = f"{v:g}"
        canvas.text(left - text_width(label) - 6, int(y) - 5, label)
    position = {x: left + (right - left) * (i + 0.5) / len(xs) for i, (x, _) in enumerate(xs)}
    for x, lab in xs:
        canvas.text(int(position[x] - text_width(lab) / 2), bottom + 8, lab)
    canvas.line(left, top, left, bottom, BLACK)
    canvas.line(left, bottom, right, bottom, BLACK)
    for i, (label, pts) in enumerate(data.items()):
        color = COLORS.get(label.split()[0], OTHER_COLOR)
        coords = [(position[x], y_of(ms)) for x, ms, _ in pts]
        if connect:
            for (xa, ya), (xb, yb) in zip(coords, coords[1:]):
                canvas.line(xa, ya, xb, yb, color, width=3)
        for xc, yc in coords:
            canvas.rect(xc - 4, yc - 4, xc + 4, yc + 4, color)
        ly = top + 8 + 16 * i
        canvas.rect(left + 10, ly, left + 30, ly + 9, color)
        canvas.text(left + 36, ly, label.replace("_", "-"))


def render(benchmarks: list[dict]) -> bytes:
    sweep, anchors = series(benchmarks, "sweep"), series(benchmarks, "anchor")
    if not sweep and not anchors:
        raise ValueError("no ssd_forward sweep or anchor benchmark in the JSON")
    canvas = Canvas(WIDTH, HEIGHT)
    panel(canvas, (80, 60, 480, 400), "SSD-FORWARD MEDIAN MS (LOG) VS SEQLEN", sweep, connect=True)
    panel(canvas, (580, 60, 980, 400), "SSD-FORWARD MEDIAN MS (LOG), SPEC ANCHOR ROWS", anchors,
          connect=False)
    canvas.text(20, 424, f"GPU time, L2 flushed. Sweep: {SWEEP_TEXT}.")
    canvas.text(20, 442, "Rows: " + ", ".join(f"{i} {name}" for i, name in enumerate(ANCHORS, 1)))
    return canvas.png()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("bench", help="pytest-benchmark JSON (from --benchmark-json=...)")
    parser.add_argument("-o", "--output", default="plot.png", help="the PNG (default plot.png)")
    args = parser.parse_args(argv)
    try:
        with open(args.bench) as f:
            benchmarks = json.load(f)["benchmarks"]
        png = render(benchmarks)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot: {e}", file=sys.stderr)
        return 2
    with open(args.output, "wb") as f:
        f.write(png)
    print(f"wrote {args.output} ({WIDTH}x{HEIGHT})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
