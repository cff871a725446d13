"""Drivers, one per system, that run inside that system's own environment (a venv, or Node).

The harness never imports them: it runs ``python -m bench.peers.<system> ACTION PARAMS_JSON`` with
the system's interpreter and reads one JSON line from stdout. Only the standard library and redis-py
(which every Python peer depends on) may be imported at module level here.
"""
