"""Reads: what a user may see, the figures derived from it, and the inputs the scheduler's pure cores decide on.
Nothing here writes."""
