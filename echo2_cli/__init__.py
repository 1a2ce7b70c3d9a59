"""``echo2``: the job owner's command line (submit job files, follow, pause, resume, cancel) over the REST API.

It installs with the agent's base dependencies (httpx, typer, rich; no Django): a laptop needs nothing else.
"""
