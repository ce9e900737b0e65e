"""NVIDIA's daemons as sidecars, the NVLink fabric, and the proof a workload runs."""
