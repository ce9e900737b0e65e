"""The qemu tier (see README.md)."""
