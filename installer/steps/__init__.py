"""The named steps plans are made of, by job. Each takes the Context; I/O goes through it."""
