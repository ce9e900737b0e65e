"""What a run writes down and reads back: cache, status, readiness, the staged driver."""
