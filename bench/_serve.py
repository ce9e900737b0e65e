"""tests.fixtures.server.ArtifactServer in its own process, for benches.

    python bench/_serve.py [--rate BYTES_PER_S] URLPATH=FILE ...

Serves each FILE at URLPATH over HTTPS on 127.0.0.1 (private CA), each
response body capped at ``--rate`` bytes/s (per connection: the per-stream
limit of an object store). Prints one JSON line ``{"url": ..., "ca": ...}``
and serves until stdin closes. A separate process keeps the server's TLS and
pacing off the measured client's CPU and GIL.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.server import ArtifactServer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=None)
    ap.add_argument("items", nargs="+")
    args = ap.parse_args()
    with ArtifactServer() as srv:
        for item in args.items:
            path, _, file = item.partition("=")
            srv.serve(path, Path(file))
            if args.rate:
                srv.fault(path, rate=args.rate)
        print(json.dumps({"url": srv.url, "ca": srv.ca_bundle_path}), flush=True)
        sys.stdin.read()  # until the parent closes our stdin
    return 0


if __name__ == "__main__":
    sys.exit(main())
