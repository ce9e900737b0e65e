"""Kubernetes manifests: the installer's DaemonSets and the bundle build Job.

``values`` (flavours, the pod contract's env and mounts, defaults), ``validate`` (what a
user may ask for, pure), ``render`` (the DaemonSet templates), ``bundle_job`` (the Job
that builds bundles) and ``cli`` (the ``manifests`` commands). Data flows one way:
cli -> validate -> render / bundle_job, all reading values.
"""
