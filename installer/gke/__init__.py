"""GKE's cos-gpu-installer command line, run by GKE's own DaemonSets (an entry point).

GKE's mirror of the COS drivers is in distros.cos (``mirror``), the Vulkan ICD step in
steps (``vulkan_icd``), what doctor reads of GKE's own installer in commands.doctor
(``coexistence``).
"""
