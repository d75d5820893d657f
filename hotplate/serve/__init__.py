"""`hotplate serve`: the lip-sync route over HTTP, a job queue on render workers, a page.

Modules: app.py (the Service and create_app), routes/ (one router per resource), deps.py
(what routes share), config.py (ServeConfig), guard.py (the ASGI middleware in front:
Host, Origin, token, body limit), jobs.py (records in SQLite, the queue), workers.py
(render processes that keep models loaded), metrics.py (Prometheus text), problems.py
(RFC 9457 errors), uploads.py (size and audio checks), static/ (the page).
"""
