"""NVIDIA's .run: where it is published, its options, running it, what it builds."""
