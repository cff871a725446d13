"""The web dashboard: an HTTP server that is a client of the dispatchers' gRPC API, as dispatcherctl
is (it uses only the SDK's public API). ``app.build_app`` makes the Starlette application; its pages
(``pages.py``) and its JSON API (``api.py``, described at /api/openapi.json) share one layer of
operations (``operations.py``) that calls the dispatchers with the signed-in user's own token, so
the dispatcher decides what each user may see and do."""
