"""Running NVIDIA's code in a jail, and reading what it wrote through no link it left."""
