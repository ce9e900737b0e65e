"""What the CLI runs: install, uninstall, doctor, manifests, bundle, the sidecars."""
