"""The leaves every layer may import: errors, values, file helpers, the pod's contract."""
