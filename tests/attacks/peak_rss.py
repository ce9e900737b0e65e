"""The CLI (``python -m installer``) that prints its own peak RSS last, for the J5 test.

Run through ``Pod.run(module="tests.attacks.peak_rss")``: the installer process itself
(not its children: the jail's spewer is not what is measured) reports
``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux) as a JSON line on stderr.
"""

import json
import resource
import runpy
import sys

try:
    runpy.run_module("installer", run_name="__main__", alter_sys=True)
finally:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_kib": peak}), file=sys.stderr, flush=True)
