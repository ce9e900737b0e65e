"""What the CLI runs: install, uninstall, doctor, manifests, bundle, the daemon sidecars.

``installer.cli`` parses the command line and calls these; some are loaded only when their
command runs (start-up time), through imports inside cli's functions: edges the layers
contract and tests/importgraph see (both read imports inside functions), never module
names in strings.
"""
