"""Pieces of Python the attack tests run inside the build jail."""

from __future__ import annotations


def fork_loop(tries: int) -> str:
    """Top-level lines that fork up to ``tries`` sleeping children and count in ``started``
    how many the jail allowed (the jail's PID namespace ends them when its command exits)."""
    return f"""started = 0
for _ in range({tries}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)  # the jail's PID namespace ends them all when the header exits
        os._exit(0)
    started += 1
"""
