#!/usr/bin/python3
"""Draws loss.csv of a training run as a PNG without matplotlib (numpy + zlib PNG writer).

  /usr/bin/python3 tools/train/plot_loss.py tools/train/runs/main/loss.csv tools/models/passkey/loss_curve.png

Top panel: answer-token loss (black) and LM loss (grey), log scale, EMA-smoothed, against training
minutes; bottom panel: answer-token accuracy. Dashed verticals mark curriculum stage changes.
"""

import struct
import sys
import zlib

import numpy as np

W, H = 800, 500
FONT = {  # 3x5 digits for axis labels
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", "m": "000000111111101",
}


def write_png(path, img):
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(t, d):
        c = struct.pack(">I", len(d)) + t + d
        return c + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))


def text(img, x, y, s, scale=2):
    for ch in s:
        g = FONT.get(ch)
        if g:
            for i, bit in enumerate(g):
                if bit == "1":
                    r, c = divmod(i, 3)
                    img[y + r * scale:y + (r + 1) * scale, x + c * scale:x + (c + 1) * scale] = 0
        x += 4 * scale


def line(img, xs, ys, color):
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for t in np.linspace(0, 1, n):
            x, y = int(round(x0 + t * (x1 - x0))), int(round(y0 + t * (y1 - y0)))
            img[max(0, y - 1):y + 1, max(0, x - 1):x + 1] = color


def ema(v, a=0.98):
    out, e = [], v[0]
    for x in v:
        e = a * e + (1 - a) * x
        out.append(e)
    return np.array(out)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    d = np.genfromtxt(src, delimiter=",", names=True)
    t, la, ll, acc, T = (d["elapsed_min"], d["loss_answer"], d["loss_lm"], d["answer_token_acc"],
                         d["seq_len"])
    img = np.full((H, W, 3), 255, np.uint8)
    x0, x1 = 60, W - 20
    tx = x0 + (t - t.min()) / max(1e-9, t.max() - t.min()) * (x1 - x0)
    # top panel: log10 loss in [-3, 1]
    ty0, ty1 = 20, 300
    lo, hi = -3.0, 1.0

    def ly(v):
        return ty1 - (np.log10(np.clip(v, 1e-3, 10)) - lo) / (hi - lo) * (ty1 - ty0)
    img[ty0:ty1 + 1, x0] = 0
    img[ty1, x0:x1] = 0
    for e in range(-3, 2):
        y = int(ly(10.0 ** e))
        img[y, x0 - 5:x0] = 0
        text(img, 5, y - 5, ("%g" % 10.0 ** e)[:5])
    # bottom panel: accuracy in [0, 1]
    by0, by1 = 340, 470
    img[by0:by1 + 1, x0] = 0
    img[by1, x0:x1] = 0
    for v in (0.0, 0.5, 1.0):
        y = int(by1 - v * (by1 - by0))
        img[y, x0 - 5:x0] = 0
        text(img, 20, y - 5, "%g" % v)
    for i in np.nonzero(np.diff(T))[0]:
        x = int(tx[i + 1])
        img[ty0:by1:6, x] = 150
    for m in range(0, int(t.max()) + 1, 10):
        x = int(x0 + (m - t.min()) / max(1e-9, t.max() - t.min()) * (x1 - x0))
        if x0 <= x <= x1:
            img[by1:by1 + 5, x] = 0
            text(img, x - 6, by1 + 10, "%dm" % m)
    step = max(1, len(t) // 1500)
    line(img, tx[::step], ly(ema(ll))[::step], (150, 150, 150))
    line(img, tx[::step], ly(ema(la))[::step], (0, 0, 0))
    line(img, tx[::step], (by1 - ema(acc) * (by1 - by0))[::step], (0, 0, 200))
    write_png(dst, img)
    print("wrote", dst)


if __name__ == "__main__":
    main()
