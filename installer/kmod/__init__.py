"""Kernel modules: files, signatures, options, loading, device nodes, firmware, kernel log."""
