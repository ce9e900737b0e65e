"""Drop-in pieces for GKE's own DaemonSets (their command line, cache and mirrors)."""
