"""Parallel artifact fetch (COS cold install) vs the reference installers' sequential fetch.

    python bench/parallel.py [--scale 1.0] [--rate-mb 25] [--runs 3] [--json-out FILE]

A COS cold install fetches the NVIDIA driver (300 MB), the toolchain (600 MB)
and the kernel headers (50 MB). Object stores limit each stream's rate, so
fetching them one after the other takes the sum of the three times while
fetching them at once takes about the largest one's.

Builds three random files of those sizes times ``--scale`` and serves them
from ``tests.fixtures.server.ArtifactServer`` (HTTPS on 127.0.0.1, private
CA) in a separate process, every response body paced to ``--rate-mb`` MB/s
per connection. Then ``--runs`` times, rotating the order:

- parallel: ``installer.net.parallel.download_all`` of the three jobs (what the
  COS flow's ``fetch_artifacts`` step does);
- sequential: ``installer.net.transfer.download`` of each in turn (the baseline);
- largest alone: ``download`` of the 600 MB toolchain only (the floor).

Each download streams, hashes and fsyncs as in a real install; every sha256
is checked. Prints median/min/max seconds and the ratios parallel/largest
(target <= 1.15) and sequential/largest. MB = 10**6 bytes.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MB, REPO, Row, Stats, print_rows, quiet_structlog, write_rows  # noqa: E402

TARGET = 1.15
ARTIFACTS = (("driver", "NVIDIA-Linux-x86_64-535.183.01.run", 300),
             ("toolchain", "toolchain.tar.xz", 600),
             ("headers", "kernel-headers.tgz", 50))


def make_file(path: Path, size: int) -> str:
    import hashlib

    h = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        left, i = size, 0
        while left:
            # A different block each MiB (cheap: a counter prefix), so no two chunks match.
            data = (i.to_bytes(8, "little") + block[8:])[: min(len(block), left)]
            f.write(data)
            h.update(data)
            left -= len(data)
            i += 1
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the 300/600/50 MB sizes (e.g. 0.1 for a quick run)")
    ap.add_argument("--rate-mb", type=float, default=25.0,
                    help="per-connection rate limit of the server, MB/s (default 25)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each mode (default 3)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch dir (default: under /tmp)")
    ap.add_argument("--json-out", help="write the summary rows here (for run_all.py)")
    args = ap.parse_args(argv)

    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # they would override our CA
        os.environ.pop(var, None)
    quiet_structlog()
    from installer.net.parallel import DownloadJob, download_all
    from installer.net.retry import RetryPolicy
    from installer.net.session import make_session
    from installer.net.transfer import download

    work = Path(tempfile.mkdtemp(prefix="bench-parallel-", dir=args.dir))
    server = None
    try:
        files, digests, sizes = {}, {}, {}
        for label, name, mb in ARTIFACTS:
            size = int(mb * MB * args.scale)
            path = work / "src" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            digests[label] = make_file(path, size)
            files[label], sizes[label] = path, size
        rate = int(args.rate_mb * MB)
        server = subprocess.Popen(
            [sys.executable, str(REPO / "bench/_serve.py"), "--rate", str(rate),
             *(f"/{label}/{files[label].name}={files[label]}" for label, _, _ in ARTIFACTS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        info = json.loads(server.stdout.readline())
        session = make_session()
        session.verify = info["ca"]
        policy = RetryPolicy(attempts=3, wait_initial=0.1, wait_max=1.0, total_timeout=600,
                             connect_timeout=10, read_timeout=60)

        def job(label: str) -> DownloadJob:
            name = files[label].name
            return DownloadJob(url=f"{info['url']}/{label}/{name}", dest=work / "out" / name,
                               expected_sha256=digests[label], label=label, policy=policy)

        def clean() -> None:
            shutil.rmtree(work / "out", ignore_errors=True)
            (work / "out").mkdir()

        def parallel() -> None:
            download_all(session, [job(label) for label, _, _ in ARTIFACTS])

        def sequential() -> None:
            for label, _, _ in ARTIFACTS:
                j = job(label)
                download(session, j.url, j.dest, expected_sha256=j.expected_sha256,
                         policy=policy, label=label)

        def largest() -> None:
            j = job("toolchain")
            download(session, j.url, j.dest, expected_sha256=j.expected_sha256, policy=policy,
                     label="toolchain")

        modes = {"parallel": parallel, "sequential": sequential, "largest": largest}
        times: dict[str, list[float]] = {m: [] for m in modes}
        order = list(modes)
        for i in range(args.runs):
            for name in order[i % 3:] + order[: i % 3]:
                clean()
                t0 = time.perf_counter()
                modes[name]()
                times[name].append(time.perf_counter() - t0)
        clean()
    finally:
        if server is not None:
            server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(work, ignore_errors=True)

    st = {m: Stats.of(v) for m, v in times.items()}
    total_mb = sum(sizes.values()) / MB
    par = st["parallel"].median / st["largest"].median
    seq = st["sequential"].median / st["largest"].median
    print("COS cold-install artifacts: "
          + ", ".join(f"{label} {sizes[label] / MB:.0f} MB" for label, _, _ in ARTIFACTS)
          + f" ({total_mb:.0f} MB), server rate {args.rate_mb:g} MB/s per connection, "
          f"{args.runs} runs each (s: median min max)")
    for name, label in (("parallel", "download_all (parallel)"),
                        ("sequential", "download x3 in sequence (baseline)"),
                        ("largest", "largest alone (toolchain)")):
        print(f"  {label:38} {st[name].fmt(1, 's', digits=2)}")
    print(f"  ratio parallel/largest:   {par:.3f}x   (target <= {TARGET})")
    print(f"  ratio sequential/largest: {seq:.3f}x   (sum of sizes / largest = "
          f"{sum(sizes.values()) / sizes['toolchain']:.3f})")
    print(f"  parallel speed-up over sequential: {st['sequential'].median / st['parallel'].median:.2f}x; "
          f"aggregate {total_mb / st['parallel'].median:.0f} MB/s")
    rows = [Row(
        target=f"parallel artifacts <= {TARGET}x largest alone",
        measured=f"{st['parallel'].median:.2f} s",
        baseline=f"sequential {st['sequential'].median:.2f} s, largest {st['largest'].median:.2f} s",
        ratio=f"{par:.2f}x (seq {seq:.2f}x)",
        met=par <= TARGET,
        note=f"{total_mb:.0f} MB at {args.rate_mb:g} MB/s per connection (scale {args.scale:g})",
        data={"parallel_s": st["parallel"].median, "sequential_s": st["sequential"].median,
              "largest_s": st["largest"].median, "ratio": par, "seq_ratio": seq,
              "scale": args.scale, "rate_mb": args.rate_mb},
    )]
    print()
    print_rows(rows)
    write_rows(rows, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
