"""Run one command and print its wall time as JSON (used inside the pod-like chroot).

    python bench/_timer.py CMD ARG...

The clock starts just before the fork and stops when the command has exited,
so interpreter start-up and imports of a Python command are counted, and the
pod's own set-up (namespaces, mounts, chroot) is not.
"""

import json
import resource
import subprocess
import sys
import time

r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, capture_output=True)
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "wall_s": wall,
    "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
    "rc": proc.returncode,
    "stderr": proc.stderr.decode(errors="replace")[-200_000:],
}))
