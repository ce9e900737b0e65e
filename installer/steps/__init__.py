"""The named steps plans are made of, by job. Each takes the Context (I/O goes through it),
returns a frozen result (records/results.py) or nothing, and notes each change it makes
on the node in the run's journal (records/journal.py) as it makes it."""
