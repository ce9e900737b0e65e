"""NVIDIA's real driver parts (from Debian's archive) packed as test ``.run`` files."""
