"""The seams to the node (HostRoot, Runner) and what they read: OS, GPUs, install dir."""
