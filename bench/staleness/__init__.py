"""The staleness sweep, driven by ``bench/bench_staleness.py``: ``runs`` trains one run under a simulated
stale pool; ``stats`` summarises runs over seeds (bootstrap intervals, censoring); ``report`` prints the table and
draws the figure."""
