"""Benchmark installer.net.transfer against curl + sha256sum, over real HTTPS on 127.0.0.1.

    python bench/download.py [--size-mb 1024] [--runs 3] [--dir DIR] [--chunk-kib N ...]

Builds a random file, serves it from a threaded ``http.server`` wrapped in TLS
(a private trustme CA), and alternates, ``--runs`` times:

- baseline: ``curl -s -o FILE --cacert CA URL`` then ``sha256sum FILE``
  (download, then hash: what a shell installer does);
- ours: ``installer.net.transfer.download()`` in a fresh Python subprocess
  (stream + sha256 + fsync + rename), timed around the call; the child
  reports its peak RSS (``ru_maxrss``).

Prints median/min/max MB/s for both, the ratio ours/curl (target >= 0.9) and
our peak RSS (target <= 80 MB). Then a resume figure: the server drops the
first connection at 90 %; we report the bytes the server sent again against
the bytes that were missing. ``--chunk-kib`` additionally times ours with
other chunk sizes (the CHUNK_SIZE choice).

MB = 10**6 bytes throughout.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import re
import shutil
import socketserver
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trustme

REPO = Path(__file__).resolve().parent.parent
MB = 1e6

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import structlog, logging
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
from installer.net import transfer as d
from installer.net.retry import RetryPolicy
from installer.net.session import make_session
url, dest, ca, chunk = sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
if chunk:
    d.CHUNK_SIZE = chunk
s = make_session()
s.verify = ca
pol = RetryPolicy(attempts=3, wait_initial=0.05, wait_max=0.2, total_timeout=120,
                  connect_timeout=5, read_timeout=30)
t0 = time.perf_counter()
r = d.download(s, url, dest, policy=pol)
t = time.perf_counter() - t0
print(json.dumps({"seconds": t, "sha256": r.sha256, "size": r.size,
                  "resumed_bytes": r.resumed_bytes,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, handler, payload: Path, ctx: ssl.SSLContext):
        super().__init__(addr, handler)
        self.payload = payload
        self.size = payload.stat().st_size
        self.ctx = ctx
        self.log: list[dict] = []
        self.lock = threading.Lock()
        self.drop_armed = False

    def get_request(self):
        sock, addr = super().get_request()
        return self.ctx.wrap_socket(sock, server_side=True), addr


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):  # noqa: N802
        srv = self.server
        size = srv.size
        start = 0
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        drop_at = None
        with srv.lock:
            if srv.drop_armed and not rng and self.path.startswith("/drop90"):
                srv.drop_armed = False
                drop_at = int(size * 0.9)
        if m and int(m.group(1)) < size:
            start = int(m.group(1))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        limit = (drop_at - start) if drop_at is not None else size - start
        try:
            with open(srv.payload, "rb", buffering=0) as f:
                f.seek(start)
                buf = bytearray(1 << 20)
                while sent < limit:
                    n = f.readinto(memoryview(buf)[: min(len(buf), limit - sent)])
                    if not n:
                        break
                    self.wfile.write(memoryview(buf)[:n])
                    sent += n
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        finally:
            self.close_connection = True
            with srv.lock:
                srv.log.append({"path": self.path, "range": rng, "sent": sent})


def _serve(payload: Path, ctx: ssl.SSLContext) -> _Server:
    srv = _Server(("127.0.0.1", 0), _Handler, payload, ctx)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return srv


def _make_payload(path: Path, size: int) -> str:
    h = hashlib.sha256()
    block = 1 << 20
    with open(path, "wb") as f:
        left = size
        while left:
            data = os.urandom(min(block, left))
            h.update(data)
            f.write(data)
            left -= len(data)
    return h.hexdigest()


def _run_curl(url: str, ca: Path, out: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    subprocess.run(["curl", "-s", "-f", "-o", str(out), "--cacert", str(ca), url], check=True)
    res = subprocess.run(["sha256sum", str(out)], check=True, capture_output=True, text=True)
    t = time.perf_counter() - t0
    return t, res.stdout.split()[0]


def _run_ours(url: str, ca: Path, out: Path, chunk: int = 0) -> dict:
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override session.verify.
    env = {k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO), url, str(out), str(ca), str(chunk)],
        env=env,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SystemExit(f"download() child failed ({res.returncode}):\n{res.stderr[-3000:]}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    info["wall_s"] = time.perf_counter() - t0
    return info


def _fmt(rates: list[float]) -> str:
    return f"{statistics.median(rates):8.1f} {min(rates):8.1f} {max(rates):8.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="payload size in MiB (default 1024)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each client (default 3)")
    ap.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where payload and downloads live (default: a temp dir under /tmp)",
    )
    ap.add_argument(
        "--chunk-kib",
        type=int,
        nargs="*",
        default=[],
        help="also time ours with these chunk sizes (KiB), one run each",
    )
    args = ap.parse_args(argv)
    if shutil.which("curl") is None or shutil.which("sha256sum") is None:
        print("needs curl and sha256sum", file=sys.stderr)
        return 2

    size = args.size_mb * 1024 * 1024
    work = Path(tempfile.mkdtemp(prefix="bench-download-", dir=args.dir))
    try:
        ca = trustme.CA()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
        ca_path = work / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_path))
        payload = work / "payload.bin"
        print(f"building {args.size_mb} MiB random payload in {work} ...", flush=True)
        want = _make_payload(payload, size)
        fs = subprocess.run(
            ["findmnt", "-no", "FSTYPE", "--target", str(work)], capture_output=True, text=True
        ).stdout.strip()
        srv = _serve(payload, ctx)
        url = f"https://127.0.0.1:{srv.server_address[1]}/payload.bin"
        out = work / "out.bin"

        curl_rates: list[float] = []
        our_rates: list[float] = []
        our_wall_rates: list[float] = []
        rss: list[float] = []
        for i in range(args.runs):
            for which in ("curl", "ours") if i % 2 == 0 else ("ours", "curl"):
                out.unlink(missing_ok=True)
                subprocess.run(["sync"], check=False)
                if which == "curl":
                    t, got = _run_curl(url, ca_path, out)
                    assert got == want, "curl checksum differs"
                    curl_rates.append(size / MB / t)
                else:
                    info = _run_ours(url, ca_path, out)
                    assert info["sha256"] == want, "our checksum differs"
                    our_rates.append(size / MB / info["seconds"])
                    our_wall_rates.append(size / MB / info["wall_s"])
                    rss.append(info["maxrss_kb"] / 1024)
        out.unlink(missing_ok=True)

        chunk_rows = []
        for kib in args.chunk_kib:
            info = _run_ours(url, ca_path, out, chunk=kib * 1024)
            assert info["sha256"] == want
            chunk_rows.append((kib, size / MB / info["seconds"], info["maxrss_kb"] / 1024))
            out.unlink(missing_ok=True)

        # Resume: the first response is cut at 90 %.
        with srv.lock:
            srv.log.clear()
            srv.drop_armed = True
        drop_url = f"https://127.0.0.1:{srv.server_address[1]}/drop90/payload.bin"
        info = _run_ours(drop_url, ca_path, out)
        assert info["sha256"] == want, "resumed download differs"
        out.unlink(missing_ok=True)
        with srv.lock:
            reqs = list(srv.log)
        first = reqs[0]["sent"] if reqs else 0
        refetched = sum(r["sent"] for r in reqs[1:])
        missing = size - first
        srv.shutdown()

        med_c, med_o = statistics.median(curl_rates), statistics.median(our_rates)
        print()
        print(f"payload {args.size_mb} MiB over HTTPS on 127.0.0.1, {args.runs} runs each, fs={fs}")
        print(f"{'client':34} {'median':>8} {'min':>8} {'max':>8}  (MB/s)")
        print(f"{'curl -o + sha256sum':34} {_fmt(curl_rates)}")
        print(f"{'download() (call)':34} {_fmt(our_rates)}")
        print(f"{'download() (incl. python start)':34} {_fmt(our_wall_rates)}")
        print(f"ratio ours/curl (median):   {med_o / med_c:.2f}   (target >= 0.9)")
        print(f"our peak RSS:               {max(rss):.1f} MB  (target <= 80 MB)")
        for kib, rate, r in chunk_rows:
            print(f"chunk {kib:>6} KiB:  {rate:8.1f} MB/s  peak RSS {r:.1f} MB")
        print(
            f"resume at 90 %: {len(reqs)} requests, missing {missing} bytes, "
            f"re-fetched {refetched} bytes ({refetched / max(missing, 1):.3f}x), "
            f"resumed_bytes={info['resumed_bytes']}, range={reqs[1]['range'] if len(reqs) > 1 else None}"
        )
        ok = med_o / med_c >= 0.9 and max(rss) <= 80 and refetched == missing
        print("PASS" if ok else "BELOW TARGET")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
