"""Which zstd level for bundles: size vs the node's decompression time, on a real bundle.

    python bench/bundle_codec.py BUNDLE [--levels 1 3 6 10 15 19] [--runs 3]

Reads a bundle (``.tar.zst`` or ``.tar.gz``: the one bench/bundle_install.py
builds), decompresses it to the plain tar once, then for gzip -6 (the bundles
before zstd) and each zstd level: compressed size, compression time (every
core, as ``bundle build``), and the median single-thread decompression time of
the whole stream (what the node's extractor pays, minus the writes). A level
that costs the node more than ~10 % of the download it saves is not worth it.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from pathlib import Path

import zstandard
from _common import MB

GZIP_LEVEL = 6  # what bundle build wrote before zstd


def plain_tar(bundle: Path) -> bytes:
    data = bundle.read_bytes()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    return zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()


def _median_s(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(bundle: Path, levels: list[int], runs: int = 3) -> list[dict]:
    raw = plain_tar(bundle)
    out = []
    t0 = time.perf_counter()
    gz = gzip.compress(raw, GZIP_LEVEL)
    out.append({"codec": f"gzip -{GZIP_LEVEL}", "bytes": len(gz),
                "compress_s": time.perf_counter() - t0,
                "decompress_s": _median_s(lambda: gzip.decompress(gz), runs)})
    for level in levels:
        cctx = zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True)
        t0 = time.perf_counter()
        zst = cctx.compress(raw)
        took = time.perf_counter() - t0
        dctx = zstandard.ZstdDecompressor()
        out.append({"codec": f"zstd -{level}", "bytes": len(zst), "compress_s": took,
                    "decompress_s": _median_s(
                        lambda z=zst, dctx=dctx: dctx.stream_reader(z, read_across_frames=True).read(),
                        runs)})
    for row in out:
        row["tar_bytes"] = len(raw)
    return out


def print_table(rows: list[dict]) -> None:
    print(f"plain tar: {rows[0]['tar_bytes'] / MB:.1f} MB")
    print(f"{'codec':10} {'MB':>8} {'ratio':>6} {'compress s':>11} {'decompress s':>13} "
          f"{'MB/s out':>9}")
    for r in rows:
        print(f"{r['codec']:10} {r['bytes'] / MB:8.1f} {r['tar_bytes'] / r['bytes']:6.2f} "
              f"{r['compress_s']:11.2f} {r['decompress_s']:13.3f} "
              f"{r['tar_bytes'] / MB / r['decompress_s']:9.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 3, 6, 10, 15, 19])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    print_table(compare(args.bundle, args.levels, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
