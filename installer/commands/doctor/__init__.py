"""``doctor``: check a node's GPU driver set-up and say what to fix.

Read-only: no lock, nothing written. Each check gives a verdict (ok, warn,
fail), a one-line detail with the facts, and for warn/fail the fix. A check
that crashes becomes a failed finding, so one odd file never hides the rest.

``node`` loads what the checks read; ``host``, ``installed`` and ``driver`` hold the
checks per area; ``report`` runs them in order and renders the result.
"""
