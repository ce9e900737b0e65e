"""The CLI (``python -m installer``) run as an unprivileged user (nobody, 65534), for the
lock trap test: root drops to it before the installer starts, as ``setpriv`` would."""

import os
import runpy

os.setgroups([])
os.setgid(65534)
os.setuid(65534)
runpy.run_module("installer", run_name="__main__", alter_sys=True)
