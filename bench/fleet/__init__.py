"""An emulated agent fleet against the real site: ``bench/bench_fleet.py`` drives it.

``engine``: a stand-in generation engine of configurable speed (no model); ``probe``: what the agents' websocket
frames say (reply latencies, refusals, pushes), recorded without touching the session's code; ``agents``: one
process running many real :class:`worker_agent.session.AgentSession` on one event loop; ``site``: the stack
(private Redis, PostgreSQL or SQLite, daphne processes, Celery, the learner) and its measurements.
"""
