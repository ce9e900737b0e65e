"""What the CLI runs: install, uninstall, doctor, manifests, bundle, the daemon sidecars.

``installer.cli`` parses the command line and calls these; ``bundle_cli``, ``sidecar_cli`` and
``manifests.cli`` are loaded only when their command runs (start-up time), and cli imports
them under TYPE_CHECKING too, so the layers contract sees those edges.
"""
